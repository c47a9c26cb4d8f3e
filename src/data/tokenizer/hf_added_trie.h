// The added-token matcher of the Hugging Face tokenizer (hf_tokenizer.cpp): a byte trie that finds the
// leftmost-longest added token, what tokenizers' AddedVocabulary gets from its Aho-Corasick automaton.
// Its own file because it is a data structure with one job, apart from reading tokenizer.json.
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace shardlm::data::hf {

// Leftmost-longest matcher over the added tokens (what tokenizers' Aho-Corasick trie gives).
class Trie {
 public:
  void add(const std::string& pattern, int token_index);
  bool empty() const { return empty_; }
  // Longest pattern starting at s[i]: (token index, length), or (-1, 0).
  std::pair<int, size_t> longest_at(std::string_view s, size_t i) const;

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    int token = -1;
  };
  std::vector<Node> nodes_{1};
  bool first_[256] = {};
  bool empty_ = true;
};

}  // namespace shardlm::data::hf
