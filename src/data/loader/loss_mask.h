// The loss-mask sidecar of a fine-tuning token file: which targets count in the loss and where each
// packed document begins, one byte per token, in a file tied to its token file so that a mask can
// never be read against tokens it was not written for. `shardlm prepare --sft` writes both; the
// DataLoader finds the sidecar next to the token file (sidecar_path) and then reads rows instead
// of a token stream.
//
// A fine-tuning token file is a sequence of rows of row_length = seq_len + 1 tokens, fixed when it
// was prepared: each row holds one sample (padded) or several whole samples one after the other
// (packed), then padding. A sample never crosses a row. Per token, the sidecar byte holds
//   bit 0 (kCountsInLoss): this token is a target that counts (a completion token or the EOS),
//   bit 1 (kDocumentStart): this token begins a sample (every row's first token has it; padding
//                           never has it and so continues the row's last sample).
// Layout (little-endian): 32-byte header {int32 magic 20240605, int32 version 1, int64 token count,
// int32 row_length, int32 packed (0 padded, 1 packed), uint32 CRC-32C of the whole token file,
// int32 0}, then one byte per token.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/token_file.h"

namespace shardlm::data {

constexpr int32_t kLossMaskMagic = 20240605;
constexpr int32_t kLossMaskVersion = 1;
constexpr int64_t kLossMaskHeaderBytes = 32;
constexpr unsigned char kCountsInLoss = 1;
constexpr unsigned char kDocumentStart = 2;

// The sidecar of token file `token_path`: token_path + ".mask" (train.bin -> train.bin.mask), so a
// glob of token files (train_*.bin) never matches a mask.
std::string sidecar_path(const std::string& token_path);

// The masks of a whole token sequence (every file of a pattern has its sidecar), each sidecar read
// in place through a read-only memory map like its token file (nothing is copied).
struct LossMasks {
  // One sidecar's bytes: the masks of tokens [begin, begin + size) of the whole sequence.
  struct Segment {
    std::shared_ptr<const void> storage;  // the mapping (or, for tests, bytes in memory)
    const unsigned char* bits = nullptr;  // one byte per token
    int64_t begin = 0, size = 0;
  };
  std::vector<Segment> segments;  // in the order of the token files
  int64_t row_length = 0;
  bool packed = false;
  std::string source;  // the first sidecar's path (for messages)

  // The bytes of the row that begins at token `start` (row_length of them: a row never crosses
  // files, so they are contiguous).
  const unsigned char* row(int64_t start) const {
    const Segment& s = segments.size() == 1 ? segments[0] : segment_of(start);
    return s.bits + (start - s.begin);
  }
  const Segment& segment_of(int64_t i) const;
};

// The sidecars of `tokens`' files, checked against them: none for pretraining data (nullptr); for
// fine-tuning data every file has one whose header names that file's token count and CRC-32C, its
// row length and packing agree with the other files', every file holds whole rows, every row
// begins a sample and no sample-start token counts in the loss. Anything else (a sidecar missing
// for some files only, another token file's mask, a truncated mask) is an error naming both files.
// Checking reads each token file and sidecar once (the CRC, the bytes); neither is kept in memory.
std::shared_ptr<const LossMasks> read_loss_masks(const Tokens& tokens);

// Writes the sidecar `path` of a token file as its bytes come (one per token), atomically like
// LlmcTokenWriter: a temporary whose header finish() completes with the count and the token file's
// CRC-32C `token_crc` (of its whole bytes), and which commit() renames into place.
class LossMaskWriter {
 public:
  LossMaskWriter(std::string path, int64_t row_length, bool packed);
  ~LossMaskWriter();
  LossMaskWriter(const LossMaskWriter&) = delete;
  LossMaskWriter& operator=(const LossMaskWriter&) = delete;
  void append(const unsigned char* bits, size_t n);
  void finish(uint32_t token_crc);  // closes the temporary (no more appends)
  void commit();
  int64_t count() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  int64_t row_length_;
  bool packed_;
  int64_t count_ = 0;
  bool finished_ = false, committed_ = false;
};

}  // namespace shardlm::data
