// Token files on disk: llm.c's .bin formats (what `shardlm prepare` and llm.c's scripts write, with
// 16-bit ids for GPT-2-sized vocabularies and 32-bit ids for Llama-3's 128k) and bare uint16/uint32
// arrays (what nanoGPT's prepare.py writes), so a run can replay either project's data.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace shardlm::data {

enum class TokenFormat { LlmcBin, RawU16, RawU32 };

// "llmc" | "raw_u16" | "raw_u32" (the spelling used by the data.format config key). "llmc" covers
// both llm.c widths: the header says which.
TokenFormat parse_token_format(const std::string& name);
const char* token_format_name(TokenFormat format);

// llm.c .bin layout: 256 little-endian int32 header words {magic, version, token count, 0...}, then
// the tokens, little-endian. karpathy/llm.c dev/data/data_common.py (HEADERS_INFO, write_datafile;
// read at commit 16635d41) defines two: "gpt-2" {20240520, 1, uint16} and "llama-3"
// {20240801, 7, uint32}.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int32_t kLlmcMagicU32 = 20240801;
constexpr int32_t kLlmcVersionU32 = 7;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;
// Ids a 16-bit file can hold: 0..65535.
constexpr int64_t kU16Ids = 65536;

// A token file's ids, whatever their width on disk; or several files read as one sequence (the
// shards `shardlm prepare --shard-tokens` writes, named by a glob such as out/train_*.bin, in sorted
// order). A file is read in place through a read-only memory map: nothing is copied, and ranks on
// one machine share one copy in the page cache (a file truncated in place while mapped, which
// `shardlm prepare`'s rename never does, would crash the run). Copies share the storage.
class Tokens {
 public:
  // Ids held in memory (tests, tools), stored as 32-bit.
  explicit Tokens(const std::vector<uint32_t>& ids);

  int64_t size() const { return size_; }
  // 16 or 32: the width on disk (of the narrowest file, for several).
  int bits() const;
  // The file's path, "(memory)", or for several files "<pattern> (<n> files)".
  const std::string& source() const { return source_; }
  uint32_t operator[](int64_t i) const {
    const Segment& s = segments_.size() == 1 ? segments_[0] : segment_of(i);
    const unsigned char* p = s.ids + (i - s.begin) * s.bytes_per_id;
    uint32_t v = p[0] | static_cast<uint32_t>(p[1]) << 8;
    if (s.bytes_per_id == 4) v |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
    return v;
  }
  // Ids [start, start + n) widened into out (what embedding takes); a range may span files.
  void widen(int64_t start, int64_t n, int64_t* out) const;
  std::vector<uint32_t> to_vector() const;

  // One file of the sequence: ids [begin, begin + size) of the whole.
  struct Segment {
    std::shared_ptr<const void> storage;  // the mapping or the in-memory bytes
    const unsigned char* ids = nullptr;   // the first id's first byte
    int64_t begin = 0, size = 0;
    int bytes_per_id = 2;
    std::string source;
  };
  const std::vector<Segment>& segments() const { return segments_; }

 private:
  friend Tokens read_tokens(const std::string& path, TokenFormat format);
  Tokens() = default;
  const Segment& segment_of(int64_t i) const;
  std::vector<Segment> segments_;
  int64_t size_ = 0;
  std::string source_;
};

// Maps the file, or every file a glob pattern (a path with *, ? or [) matches, in sorted order;
// throws shardlm::Error for a missing, malformed or empty file or a pattern that matches none.
Tokens read_tokens(const std::string& path, TokenFormat format);

// The checks a run makes before using tokens with a model of vocab_size ids, in one pass: a 16-bit
// file cannot serve a vocabulary of more than 65536 ids (it was tokenized for another vocabulary or
// cut to 16 bits), and every id must be < vocab_size. The error names the file, the first bad
// id's position and value, and the fix.
void check_token_ids(const Tokens& tokens, int64_t vocab_size);

// The llm.c width for a vocabulary: 16 bits while every id fits (vocab_size <= 65536), else 32.
int llmc_bits_for_vocab(int64_t vocab_size);

// Writes an llm.c .bin file with `bits` (16 or 32) per id as it comes, atomically: the ids go to
// a temporary file in the same folder, which commit() renames over `path` after patching the
// header's count (finish()), so a reader never sees half a file and an interrupted writer (an error, a kill)
// leaves the old file intact; the destructor removes an uncommitted temporary. An id that does not
// fit, an empty file and more ids than the header's int32 count holds are refused.
class LlmcTokenWriter {
 public:
  LlmcTokenWriter(std::string path, int bits);
  ~LlmcTokenWriter();
  LlmcTokenWriter(const LlmcTokenWriter&) = delete;
  LlmcTokenWriter& operator=(const LlmcTokenWriter&) = delete;
  void append(const uint32_t* ids, size_t n);
  // Patches the count and closes the temporary (no more appends); commit() then only renames. A
  // writer of many files finishes each as it is done, so only one is open at a time.
  void finish();
  void commit();
  int64_t count() const { return count_; }
  const std::string& path() const { return path_; }
  // Where the ids are written until commit() (a loss-mask sidecar hashes it, see loss_mask.h).
  const std::string& temporary_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  int bits_;
  int64_t count_ = 0;
  std::FILE* file_ = nullptr;
  bool finished_ = false, committed_ = false;
  std::vector<unsigned char> buffer_;
};

// The most ids one llm.c file holds: its header counts them in an int32.
constexpr int64_t kLlmcMaxTokens = INT32_MAX;

// All of `tokens` into one file through LlmcTokenWriter (16 bits by default, as llm.c's
// write_datafile).
void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens, int bits = 16);

}  // namespace shardlm::data
