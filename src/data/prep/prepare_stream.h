// The streaming pieces both prepares share (`shardlm prepare`, data/prep/prepare.h, and `prepare --sft`,
// data/prep/sft.h): inputs are read in batches of text, each batch is encoded on every core (one
// tokenizer per thread, contiguous parts of about equal bytes, joined back in input order, so the
// output never depends on the thread count), and what was encoded goes to a staging file on disk
// until the split into training and validation is known. Memory is then bounded by one batch
// whatever the corpus size.
#pragma once
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace shardlm::data {

// Text per encoding batch and thread: large enough to amortize starting threads, small enough
// that a batch of a 1 GB corpus is a few MB.
constexpr size_t kBatchBytesPerThread = 1 << 20;

// The cores this process may run on (its affinity mask: a container's share, not the host's).
int usable_cores();

// `threads` tokenizers of one file (0: usable_cores()), and the parallel loop over a batch.
class EncoderPool {
 public:
  // Loads the first tokenizer, calls check(it) (which may fail() before more are loaded), then the rest.
  // `eos_token`: prepare's --eos-token ("" : the tokenizer's own rule, tokenizer.h).
  EncoderPool(const std::string& tokenizer, int threads, const std::function<void(const Tokenizer&)>& check = {},
              const std::string& eos_token = "");
  const Tokenizer& tokenizer() const { return *tokenizers_[0]; }
  int threads() const { return static_cast<int>(tokenizers_.size()); }
  // Cuts items [0, bytes.size()) into threads() contiguous parts of about equal bytes and runs
  // work(part, begin, end, tokenizer) on each, part p on its own thread with tokenizer p; once all
  // are done, rethrows the error of the first part that failed.
  void run(const std::vector<size_t>& bytes,
           const std::function<void(size_t part, size_t begin, size_t end, const Tokenizer& tok)>& work) const;

 private:
  std::vector<std::unique_ptr<Tokenizer>> tokenizers_;
};

// A scratch file in `out_dir` for bytes in input order, unlinked as soon as it is created (a killed
// prepare leaves nothing behind), written once and then read back.
class Staging {
 public:
  explicit Staging(const std::string& out_dir);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  void append(const void* data, size_t bytes);
  int64_t bytes() const { return bytes_; }
  // Reading back from byte `offset` on (after the last append).
  void seek(int64_t offset);
  void read(void* data, size_t bytes);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t bytes_ = 0;
};

// out_dir, created if need be; one created here is removed again if it is still empty when this
// goes out of scope (prepare failed before writing into it).
class OutputFolder {
 public:
  explicit OutputFolder(const std::string& out_dir);
  ~OutputFolder();
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

 private:
  std::string made_;
};

// DIR/<split>.bin, or with shards DIR/<split>_NNNNNN.bin (shard counted from 0).
std::string token_file_path(const std::string& out_dir, const std::string& split, bool sharded, size_t shard);

}  // namespace shardlm::data
