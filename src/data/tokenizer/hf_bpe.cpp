// BPE of tokenizer.json (see hf_bpe.h): construction checks and the merge loop.
#include "data/tokenizer/hf_bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "data/tokenizer/hf_text.h"
#include "util/error.h"

namespace shardlm::data::hf {

namespace {

uint64_t pair_key(int a, int b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::atomic<uint64_t> next_cache_key{1};

// tokenizers caches words shorter than 256 bytes, up to 10000 of them per model.
constexpr size_t kCacheMaxWord = 256;
constexpr size_t kCacheCapacity = 10000;

struct WordCache {
  uint64_t key = 0;
  std::unordered_map<std::string, std::vector<int>> words;
};

WordCache& thread_cache(uint64_t key) {
  thread_local WordCache cache;
  if (cache.key != key) {
    cache.words.clear();
    cache.key = key;
  }
  return cache;
}

struct Symbol {
  int id;
  int prev, next;
  bool alive;
};

struct Merge {
  uint32_t rank;
  int pos;
  int new_id;
  // std::priority_queue is a max-heap: the "largest" is the lowest rank, then the lowest position.
  bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

Bpe::Bpe(std::vector<std::pair<std::string, int>> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, std::string unk_token,
         bool fuse_unk, bool byte_fallback, bool ignore_merges, const std::string& what)
    : fuse_unk_(fuse_unk), byte_fallback_(byte_fallback), ignore_merges_(ignore_merges),
      cache_key_(next_cache_key.fetch_add(1)) {
  vocab_.reserve(vocab.size() * 2);
  for (auto& [token, id] : vocab) {
    storage_.push_back(std::move(token));
    const std::string& s = storage_.back();
    vocab_[std::string_view(s)] = id;  // a repeated key keeps the last id, as serde's map does
    vocab_r_[id] = &s;
    if (id > max_id_) max_id_ = id;
  }
  std::string merged;
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int a_id = token_to_id(a), b_id = token_to_id(b);
    if (a_id < 0 || b_id < 0) {
      fail(what, ": BPE merge ", rank + 1, " (", a, " ", b, ") names ", a_id < 0 ? a : b,
           ", which is not in the vocabulary (tokenizers refuses this file too)");
    }
    merged.assign(a).append(b);
    const int new_id = token_to_id(merged);
    if (new_id < 0) {
      fail(what, ": BPE merge ", rank + 1, " (", a, " ", b, ") makes ", merged,
           ", which is not in the vocabulary (tokenizers refuses this file too)");
    }
    merges_[pair_key(a_id, b_id)] = {static_cast<uint32_t>(rank), new_id};
  }
  if (!unk_token.empty()) {
    unk_id_ = token_to_id(unk_token);
    // tokenizers fails at encode time when an unknown piece meets an unk_token outside the
    // vocabulary; failing at load time is the same refusal, earlier.
    if (unk_id_ < 0) fail(what, ": the BPE unk_token ", unk_token, " is not in the vocabulary");
  }
  all_bytes_ = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
    if (byte_ids_[b] < 0) all_bytes_ = false;
  }
}

int Bpe::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::id_to_token(int id) const {
  const auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : it->second;
}

void Bpe::tokenize(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int id = token_to_id(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() >= kCacheMaxWord) {
    merge_word(word, out);
    return;
  }
  WordCache& cache = thread_cache(cache_key_);
  thread_local std::string key;
  key.assign(word);
  const auto it = cache.words.find(key);
  if (it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cache.words.size() < kCacheCapacity) {
    cache.words.emplace(key, std::vector<int>(out.begin() + static_cast<long>(first), out.end()));
  }
}

void Bpe::merge_word(std::string_view w, std::vector<int>& out) const {
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](int id) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };
  // Initial symbols: one per character, as BPE::merge_word (a pending unk is emitted before the
  // next known character but, as there, not before byte-fallback pieces).
  int unk_pending = -1;
  for (size_t i = 0; i < w.size();) {
    const size_t len = char_len(static_cast<unsigned char>(w[i]));
    const std::string_view ch = w.substr(i, len);
    const int id = token_to_id(ch);
    if (id >= 0) {
      if (unk_pending >= 0) {
        add(unk_pending);
        unk_pending = -1;
      }
      add(id);
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
          done = true;
        }
      }
      if (!done && unk_id_ >= 0) {
        if (unk_pending >= 0 && !fuse_unk_) add(unk_pending);
        unk_pending = unk_id_;
      }
    }
    i += len;
  }
  if (unk_pending >= 0) add(unk_pending);

  thread_local std::vector<Merge> heap_storage;
  heap_storage.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    const auto m = merges_.find(pair_key(symbols[i].id, symbols[i + 1].id));
    if (m != merges_.end()) heap_storage.push_back({m->second.first, static_cast<int>(i), m->second.second});
  }
  std::priority_queue<Merge, std::vector<Merge>> queue(std::less<Merge>(), std::move(heap_storage));
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    const int next_pos = cur.next;
    const Symbol right = symbols[static_cast<size_t>(next_pos)];
    const auto m = merges_.find(pair_key(cur.id, right.id));
    if (m == merges_.end() || m->second.second != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = right.next;
    symbols[static_cast<size_t>(next_pos)].alive = false;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      const auto pm = merges_.find(pair_key(symbols[static_cast<size_t>(cur.prev)].id, cur.id));
      if (pm != merges_.end()) queue.push({pm->second.first, cur.prev, pm->second.second});
    }
    if (cur.next >= 0) {
      const auto nm = merges_.find(pair_key(cur.id, symbols[static_cast<size_t>(cur.next)].id));
      if (nm != merges_.end()) queue.push({nm->second.first, top.pos, nm->second.second});
    }
  }
  heap_storage = std::vector<Merge>();  // the queue took the buffer; keep the thread_local valid
  for (const Symbol& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace shardlm::data::hf
