// What test_sft.cpp (prepare --sft) and test_sft_loader.cpp (the DataLoader over its rows) share:
// the sample pairs, the expected sample from the tokenizer's own encode, the mask bits and the
// readers. Each test file includes it once; everything is in an unnamed namespace (inline: a file
// need not use every helper).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/data_loader.h"
#include "data/loader/loss_mask.h"
#include "data/loader/token_file.h"
#include "data/prep/prepare_stream.h"
#include "data/prep/sft.h"
#include "data/tokenizer/tokenizer.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {

const std::string kModel = source_path("data/brown/tokenizer.model");

struct Pair {
  std::string prompt, completion;
};

// One JSON line per pair (the texts here hold no character that needs escaping).
inline std::string jsonl(const std::vector<Pair>& pairs) {
  std::string s;
  for (const Pair& p : pairs) s += "{\"prompt\": \"" + p.prompt + "\", \"completion\": \"" + p.completion + "\"}\n";
  return s;
}

// A sample as sft.h defines it, with the mask bits expected for each token.
struct Expected {
  std::vector<uint32_t> ids;
  std::vector<unsigned char> bits;
  int64_t counted = 0;  // completion tokens + EOS
};

inline Expected expected_sample(const Tokenizer& tok, const Pair& p) {
  Expected e;
  e.ids.push_back(static_cast<uint32_t>(tok.bos_id()));
  e.bits.push_back(kDocumentStart);
  for (int id : tok.encode(p.prompt, false)) {
    e.ids.push_back(static_cast<uint32_t>(id));
    e.bits.push_back(0);
  }
  for (int id : tok.encode(p.completion, false)) {
    e.ids.push_back(static_cast<uint32_t>(id));
    e.bits.push_back(kCountsInLoss);
    ++e.counted;
  }
  e.ids.push_back(static_cast<uint32_t>(tok.eos_id()));
  e.bits.push_back(kCountsInLoss);
  ++e.counted;
  return e;
}

// Appends padding (eos ids, bits 0) up to a multiple of `row`.
inline void pad_row(std::vector<uint32_t>* ids, std::vector<unsigned char>* bits, int64_t row, uint32_t eos) {
  while (static_cast<int64_t>(ids->size()) % row != 0) {
    ids->push_back(eos);
    bits->push_back(0);
  }
}

inline SftOptions options(const TempDir& dir, int64_t seq_len, bool pack) {
  SftOptions o;
  o.inputs = {dir.file("in.jsonl")};
  o.tokenizer = kModel;
  o.out_dir = dir.file("out");
  o.val_fraction = 0.0;
  o.seq_len = seq_len;
  o.pack = pack;
  return o;
}

inline int64_t le(const std::vector<unsigned char>& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(b[at + static_cast<size_t>(i)]) << (8 * i);
  return static_cast<int64_t>(v);
}

// The sidecar's per-token bytes after checking its header's count, row length and packing.
inline std::vector<unsigned char> mask_bits(const std::string& token_path, int64_t count, int64_t row, bool packed) {
  const std::vector<unsigned char> m = read_bytes(sidecar_path(token_path));
  EXPECT_EQ(static_cast<int64_t>(m.size()), kLossMaskHeaderBytes + count);
  if (static_cast<int64_t>(m.size()) < kLossMaskHeaderBytes) return {};
  EXPECT_EQ(le(m, 0, 4), kLossMaskMagic);
  EXPECT_EQ(le(m, 8, 8), count);
  EXPECT_EQ(le(m, 16, 4), row);
  EXPECT_EQ(le(m, 20, 4), packed ? 1 : 0);
  return {m.begin() + kLossMaskHeaderBytes, m.end()};
}

inline std::shared_ptr<const Tokens> load(const std::string& path) {
  return std::make_shared<const Tokens>(read_tokens(path, TokenFormat::LlmcBin));
}

inline int64_t entries(const std::string& dir) {
  return std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator{});
}

const std::vector<Pair> kPadded = {
    {"Question: what did the jury say?", "It said the election was conducted well."},
    {"Name the city.", "Atlanta"},
    {"What did the grand jury comment on?", "A number of other topics, among them the police."},
};

}  // namespace
