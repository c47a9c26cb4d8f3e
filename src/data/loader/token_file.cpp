// Reading and writing token files; every malformed case gets its own message because a wrong
// data.format or a half-copied file is the usual first-run mistake, and a file tokenized for
// another vocabulary is the usual second.
#include "data/loader/token_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/loader/mapped_file.h"
#include "util/error.h"
#include "util/glob.h"

namespace shardlm::data {
namespace {

// The formats are defined little-endian; converting byte by byte keeps the code correct on any host.
uint32_t le_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

int32_t le_i32(const unsigned char* p) { return static_cast<int32_t>(le_u32(p)); }

void put_le(unsigned char* p, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::shared_ptr<const MappedFile> map_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail("token file ", path, " does not exist; check data.train/data.val (paths are relative to ",
         "the working directory) or create it with `shardlm prepare`");
  }
  if (std::filesystem::is_directory(path, ec)) {
    fail("token file ", path, " is a directory; point the data path at a .bin file inside it");
  }
  return map_whole_file(path, "token file");
}

struct Layout {
  int64_t offset, count;
  int bytes_per_id;
};

Layout parse_llmc(const std::string& path, const unsigned char* bytes, int64_t size) {
  if (size == 0) {
    fail("token file ", path, " is empty; regenerate it with `shardlm prepare`");
  }
  if (size < kLlmcHeaderBytes) {
    fail("token file ", path, " has ", size, " bytes, shorter than the ", kLlmcHeaderBytes,
         "-byte llm.c header; the file is truncated or not an llm.c .bin file ",
         "(if this is a raw uint16 token file (nanoGPT), set data.format to raw_u16; raw_u32 for uint32 ids)");
  }
  const int32_t magic = le_i32(bytes);
  if (magic != kLlmcMagic && magic != kLlmcMagicU32) {
    fail("token file ", path, " has magic number ", magic, " where an llm.c .bin file has ", kLlmcMagic,
         " (uint16 ids) or ", kLlmcMagicU32, " (uint32 ids); if this is a raw uint16 token file (nanoGPT), ",
         "set data.format to raw_u16 (raw_u32 for uint32 ids), otherwise regenerate it with `shardlm prepare`");
  }
  const bool wide = magic == kLlmcMagicU32;
  const int32_t version = le_i32(bytes + 4);
  const int32_t expected = wide ? kLlmcVersionU32 : kLlmcVersion;
  if (version != expected) {
    fail("token file ", path, " has llm.c format version ", version, " under magic ", magic,
         ", which llm.c writes only with version ", expected, wide ? " (uint32 ids)" : " (uint16 ids)",
         "; the header is corrupt or from an unknown llm.c variant; regenerate it with `shardlm prepare` ",
         "or llm.c's dev/data scripts");
  }
  const int bytes_per_id = wide ? 4 : 2;
  const int64_t count = le_i32(bytes + 8);
  const int64_t body = size - kLlmcHeaderBytes;
  if (count <= 0) {
    fail("token file ", path, " header says it holds ", count,
         " tokens; an empty or corrupt file cannot train; regenerate it with `shardlm prepare`");
  }
  const int64_t need = bytes_per_id * count;
  if (body < need) {
    fail("token file ", path, " is truncated: its header says ", count, " tokens = ", need,
         " bytes but the file has ", body, " bytes after the header; copy or regenerate it again");
  }
  if (body > need) {
    fail("token file ", path, " has ", body - need, " extra bytes: its header says ", count, " tokens = ", need,
         " bytes but the file has ", body, " bytes after the header; the file is corrupt or was appended to; ",
         "regenerate it");
  }
  return {kLlmcHeaderBytes, count, bytes_per_id};
}

Layout parse_raw(const std::string& path, int64_t size, int bytes_per_id) {
  if (size == 0) {
    fail("token file ", path, " is empty; regenerate it (nanoGPT's prepare.py or `shardlm prepare`)");
  }
  if (size % bytes_per_id != 0) {
    if (bytes_per_id == 2) {
      fail("token file ", path, " has an odd number of bytes (", size,
           ") so it is not a raw uint16 token file; it is truncated, or set data.format to llmc ",
           "if it is an llm.c .bin file");
    }
    fail("token file ", path, " has ", size, " bytes, not a multiple of 4, so it is not a raw uint32 token ",
         "file; it is truncated, or set data.format to llmc if it is an llm.c .bin file (raw_u16 for uint16 ids)");
  }
  return {0, size / bytes_per_id, bytes_per_id};
}

}  // namespace

TokenFormat parse_token_format(const std::string& name) {
  if (name == "llmc") return TokenFormat::LlmcBin;
  if (name == "raw_u16") return TokenFormat::RawU16;
  if (name == "raw_u32") return TokenFormat::RawU32;
  fail("unknown token file format '", name, "' (data.format); use \"llmc\" (llm.c .bin with a 1024-byte ",
       "header, 16- or 32-bit ids), \"raw_u16\" (bare uint16 ids, nanoGPT) or \"raw_u32\" (bare uint32 ids)");
}

const char* token_format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::LlmcBin: return "llmc";
    case TokenFormat::RawU16: return "raw_u16";
    case TokenFormat::RawU32: return "raw_u32";
  }
  return "?";
}

Tokens::Tokens(const std::vector<uint32_t>& ids) : size_(static_cast<int64_t>(ids.size())), source_("(memory)") {
  auto bytes = std::make_shared<std::vector<unsigned char>>(4 * ids.size());
  for (size_t i = 0; i < ids.size(); ++i) put_le(bytes->data() + 4 * i, ids[i], 4);
  Segment s;
  s.ids = bytes->data();
  s.size = size_;
  s.bytes_per_id = 4;
  s.source = source_;
  s.storage = std::move(bytes);
  segments_.push_back(std::move(s));
}

int Tokens::bits() const {
  int bytes = 4;
  for (const Segment& s : segments_) bytes = std::min(bytes, s.bytes_per_id);
  return bytes * 8;
}

const Tokens::Segment& Tokens::segment_of(int64_t i) const {
  // The last segment that begins at or before i.
  auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                             [](int64_t v, const Segment& s) { return v < s.begin; });
  return *(it - 1);
}

void Tokens::widen(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || n < 0 || start + n > size_) {
    fail("tokens [", start, ", ", start + n, ") of ", source_, " are outside its ", size_, " tokens (internal error)");
  }
  while (n > 0) {
    const Segment& s = segment_of(start);
    const int64_t here = std::min(n, s.begin + s.size - start);
    const unsigned char* p = s.ids + (start - s.begin) * s.bytes_per_id;
    if (s.bytes_per_id == 2) {
      for (int64_t i = 0; i < here; ++i) out[i] = p[2 * i] | p[2 * i + 1] << 8;
    } else {
      for (int64_t i = 0; i < here; ++i) out[i] = le_u32(p + 4 * i);
    }
    start += here;
    n -= here;
    out += here;
  }
}

std::vector<uint32_t> Tokens::to_vector() const {
  std::vector<uint32_t> ids(static_cast<size_t>(size_));
  for (int64_t i = 0; i < size_; ++i) ids[static_cast<size_t>(i)] = (*this)[i];
  return ids;
}

namespace {

std::vector<std::string> glob_files(const std::string& pattern) {
  std::vector<std::string> files = util::glob_sorted(pattern);
  if (files.empty()) {
    fail("token file pattern ", pattern, " matches no file; check data.train/data.val (paths are relative ",
         "to the working directory) or create the shards with `shardlm prepare --shard-tokens N`");
  }
  return files;
}

Tokens::Segment read_segment(const std::string& path, TokenFormat format) {
  std::shared_ptr<const MappedFile> m = map_file(path);
  const Layout l = format == TokenFormat::LlmcBin ? parse_llmc(path, m->bytes, m->size)
                                                  : parse_raw(path, m->size, format == TokenFormat::RawU16 ? 2 : 4);
  Tokens::Segment s;
  s.ids = m->bytes + l.offset;
  s.size = l.count;
  s.bytes_per_id = l.bytes_per_id;
  s.source = path;
  s.storage = std::move(m);
  return s;
}

}  // namespace

Tokens read_tokens(const std::string& path, TokenFormat format) {
  std::error_code ec;  // a file whose name holds *, ? or [ is itself, not a pattern
  const bool pattern = util::is_glob(path) && !std::filesystem::exists(path, ec);
  const std::vector<std::string> files = pattern ? glob_files(path) : std::vector<std::string>{path};
  Tokens t;
  for (const std::string& file : files) {
    Tokens::Segment s = read_segment(file, format);
    s.begin = t.size_;
    t.size_ += s.size;
    t.segments_.push_back(std::move(s));
  }
  t.source_ = files.size() == 1 ? files[0] : path + " (" + std::to_string(files.size()) + " files)";
  return t;
}

void check_token_ids(const Tokens& tokens, int64_t vocab_size) {
  if (vocab_size < 1) fail("vocab_size ", vocab_size, " must be at least 1 (internal error)");
  for (const Tokens::Segment& s : tokens.segments()) {
    if (s.bytes_per_id == 2 && vocab_size > kU16Ids) {
      fail("token file ", s.source, " holds 16-bit ids (llm.c version 1 or raw_u16), but the model's vocab_size is ",
           vocab_size, ", more ids than 16 bits hold (", kU16Ids, "), so the file was tokenized for a smaller vocabulary "
           "or its ids were cut to 16 bits. Prepare 32-bit tokens with the model's tokenizer: `shardlm prepare` writes ",
           "llm.c version 7 (uint32) files for vocabularies over ", kU16Ids, " (llm.c's dev/data scripts: model_desc ",
           "llama-3), or use data.format=raw_u32 for bare uint32 ids");
    }
    if (s.bytes_per_id == 2 && vocab_size == kU16Ids) continue;  // every 16-bit id is in range
    for (int64_t i = 0; i < s.size; ++i) {  // straight from the segment: no lookup per id
      const unsigned char* p = s.ids + i * s.bytes_per_id;
      const uint32_t id = s.bytes_per_id == 2 ? (p[0] | static_cast<uint32_t>(p[1]) << 8) : le_u32(p);
      if (static_cast<int64_t>(id) >= vocab_size) {
        fail("token file ", s.source, ": token ", id, " at position ", i, " (0-based token index) is >= the ",
             "model's vocab_size ", vocab_size, ". The file was tokenized with a different (larger) vocabulary than ",
             "the model's; re-run `shardlm prepare` with the model's tokenizer or set model.vocab_size.");
      }
    }
  }
}

int llmc_bits_for_vocab(int64_t vocab_size) { return vocab_size <= kU16Ids ? 16 : 32; }

LlmcTokenWriter::LlmcTokenWriter(std::string path, int bits) : path_(std::move(path)), bits_(bits) {
  if (bits != 16 && bits != 32) fail("llm.c token files hold 16- or 32-bit ids, not ", bits, " (internal error)");
  tmp_ = path_ + ".tmp";
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_) {
    fail("cannot create ", tmp_, ": ", std::strerror(errno), " (a folder that does not exist or is not writable, ",
         "or too many open files: ulimit -n)");
  }
  // The header's count is patched in commit(); the rest of the header is fixed.
  std::vector<unsigned char> header(static_cast<size_t>(kLlmcHeaderBytes), 0);
  put_le(header.data(), static_cast<uint32_t>(bits == 16 ? kLlmcMagic : kLlmcMagicU32), 4);
  put_le(header.data() + 4, static_cast<uint32_t>(bits == 16 ? kLlmcVersion : kLlmcVersionU32), 4);
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size()) {
    fail("cannot write ", tmp_, "; check free disk space and rerun");
  }
}

LlmcTokenWriter::~LlmcTokenWriter() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(tmp_.c_str());
}

void LlmcTokenWriter::append(const uint32_t* ids, size_t n) {
  if (finished_) fail("internal error: ", path_, " was finished before all its ids were appended");
  if (count_ + static_cast<int64_t>(n) > kLlmcMaxTokens) {
    fail("cannot write ", path_, ": more than ", kLlmcMaxTokens, " tokens exceed the llm.c header's int32 count; ",
         "write shards (`shardlm prepare --shard-tokens N`)");
  }
  const int width = bits_ / 8;
  buffer_.resize(width * n);
  for (size_t i = 0; i < n; ++i) {
    if (bits_ == 16 && ids[i] >= kU16Ids) {
      fail("cannot write ", path_, " with 16-bit ids: token ", ids[i], " at position ", count_ + static_cast<int64_t>(i),
           " does not fit; write 32-bit ids (llm.c version 7), which vocabularies over ", kU16Ids, " need");
    }
    put_le(buffer_.data() + width * i, ids[i], width);
  }
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    fail("cannot write ", tmp_, " (", count_ * width + kLlmcHeaderBytes, " bytes so far): ", std::strerror(errno),
         "; check free disk space and rerun");
  }
  count_ += static_cast<int64_t>(n);
}

void LlmcTokenWriter::finish() {
  if (finished_) return;
  if (count_ == 0) {
    fail("refusing to write ", path_, " with no tokens: readers reject empty token files; ",
         "give `shardlm prepare` more text or a smaller --val-fraction");
  }
  unsigned char count[4];
  put_le(count, static_cast<uint32_t>(count_), 4);
  const bool ok = std::fseek(file_, 8, SEEK_SET) == 0 && std::fwrite(count, 1, 4, file_) == 4;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) fail("cannot write ", tmp_, " (", count_, " tokens); check free disk space and rerun");
  finished_ = true;
}

void LlmcTokenWriter::commit() {
  finish();
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) fail("cannot rename ", tmp_, " to ", path_, ": ", ec.message(), "; check the folder's permissions");
  committed_ = true;
}

void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens, int bits) {
  LlmcTokenWriter writer(path, bits);
  writer.append(tokens.data(), tokens.size());
  writer.commit();
}

}  // namespace shardlm::data
