// The BPE model of a tokenizer.json, apart from the pipeline around it because it is the hot loop:
// merges applied by rank with a binary heap over a linked list of symbols (O(n log n) per word, as
// tokenizers' Word::merge_all), a (left id, right id) -> (rank, merged id) hash, a vocabulary keyed
// by string_view into owned storage (no allocation per lookup), and a per-thread cache of words.
// byte_fallback, unk_token/fuse_unk and ignore_merges behave as in tokenizers' models/bpe.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardlm::data::hf {

class Bpe {
 public:
  // vocab: token -> id; merges: pairs in rank order. `what` names the file in errors.
  Bpe(std::vector<std::pair<std::string, int>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, std::string unk_token,
      bool fuse_unk, bool byte_fallback, bool ignore_merges, const std::string& what);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int>& out) const;

  int token_to_id(std::string_view token) const;  // -1 when absent
  const std::string* id_to_token(int id) const;   // nullptr when absent
  size_t size() const { return vocab_.size(); }   // number of vocabulary entries
  int max_id() const { return max_id_; }

 private:
  void merge_word(std::string_view word, std::vector<int>& out) const;

  std::deque<std::string> storage_;  // owns the token strings vocab_ points into
  std::unordered_map<std::string_view, int> vocab_;
  std::unordered_map<int, const std::string*> vocab_r_;
  std::unordered_map<uint64_t, std::pair<uint32_t, int>> merges_;  // (a<<32|b) -> (rank, new id)
  int byte_ids_[256];  // <0xXX> ids for byte_fallback, -1 when absent
  bool all_bytes_ = false;
  int unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int max_id_ = -1;
  uint64_t cache_key_;  // distinguishes this model's entries in the per-thread cache
};

}  // namespace shardlm::data::hf
