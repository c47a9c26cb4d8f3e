// See hf_added_trie.h.
#include "data/tokenizer/hf_added_trie.h"

namespace shardlm::data::hf {

void Trie::add(const std::string& pattern, int token_index) {
  if (pattern.empty()) return;
  int node = 0;
  for (unsigned char c : pattern) {
    auto it = nodes_[node].next.find(c);
    if (it == nodes_[node].next.end()) {
      nodes_.push_back({});
      it = nodes_[node].next.emplace(c, static_cast<int>(nodes_.size()) - 1).first;
    }
    node = it->second;
  }
  nodes_[node].token = token_index;
  first_[static_cast<unsigned char>(pattern[0])] = true;
  empty_ = false;
}

std::pair<int, size_t> Trie::longest_at(std::string_view s, size_t i) const {
  if (!first_[static_cast<unsigned char>(s[i])]) return {-1, 0};
  int node = 0;
  std::pair<int, size_t> best{-1, 0};
  for (size_t k = i; k < s.size(); ++k) {
    const auto it = nodes_[node].next.find(static_cast<unsigned char>(s[k]));
    if (it == nodes_[node].next.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, k + 1 - i};
  }
  return best;
}

}  // namespace shardlm::data::hf
