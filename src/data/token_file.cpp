// Reading and writing token files; every malformed case gets its own message because a wrong
// data.format or a half-copied file is the usual first-run mistake.
#include "data/token_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "util/error.h"

namespace shardlm::data {
namespace {

// The formats are defined little-endian; converting byte by byte keeps the code correct on any host.
int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

void put_le_i32(unsigned char* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(u >> (8 * i));
}

std::vector<unsigned char> read_all(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail("token file ", path, " does not exist; check data.train/data.val (paths are relative to ",
         "the working directory) or create it with `shardlm prepare`");
  }
  if (std::filesystem::is_directory(path, ec)) {
    fail("token file ", path, " is a directory; point the data path at a .bin file inside it");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open token file ", path, ": ", std::strerror(errno), "; check its permissions");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::vector<unsigned char> bytes(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    fail("cannot read token file ", path, " (", size, " bytes); check the disk and rerun");
  }
  return bytes;
}

std::vector<uint16_t> decode_u16(const unsigned char* p, size_t count) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
  }
  return tokens;
}

std::vector<uint16_t> parse_llmc(const std::string& path, const std::vector<unsigned char>& bytes) {
  const auto size = static_cast<int64_t>(bytes.size());
  if (size == 0) {
    fail("token file ", path, " is empty; regenerate it with `shardlm prepare`");
  }
  if (size < kLlmcHeaderBytes) {
    fail("token file ", path, " has ", size, " bytes, shorter than the ", kLlmcHeaderBytes,
         "-byte llm.c header; the file is truncated or not an llm.c .bin file ",
         "(if this is a raw uint16 token file (nanoGPT), set data.format to raw_u16)");
  }
  const int32_t magic = le_i32(bytes.data());
  if (magic != kLlmcMagic) {
    fail("token file ", path, " has magic number ", magic, " where an llm.c .bin file has ",
         kLlmcMagic, "; if this is a raw uint16 token file (nanoGPT), set data.format to raw_u16, ",
         "otherwise regenerate it with `shardlm prepare`");
  }
  const int32_t version = le_i32(bytes.data() + 4);
  if (version != kLlmcVersion) {
    fail("token file ", path, " has llm.c format version ", version, " but only version ",
         kLlmcVersion, " (uint16 tokens) is supported; regenerate it with `shardlm prepare` or ",
         "llm.c's dev/data scripts");
  }
  const int64_t count = le_i32(bytes.data() + 8);
  const int64_t body = size - kLlmcHeaderBytes;
  if (count <= 0) {
    fail("token file ", path, " header says it holds ", count,
         " tokens; an empty or corrupt file cannot train; regenerate it with `shardlm prepare`");
  }
  if (body < 2 * count) {
    fail("token file ", path, " is truncated: its header says ", count, " tokens = ", 2 * count,
         " bytes but the file has ", body, " bytes after the header; copy or regenerate it again");
  }
  if (body > 2 * count) {
    fail("token file ", path, " has ", body - 2 * count, " extra bytes: its header says ", count,
         " tokens = ", 2 * count, " bytes but the file has ", body,
         " bytes after the header; the file is corrupt or was appended to; regenerate it");
  }
  return decode_u16(bytes.data() + kLlmcHeaderBytes, static_cast<size_t>(count));
}

std::vector<uint16_t> parse_raw(const std::string& path, const std::vector<unsigned char>& bytes) {
  if (bytes.empty()) {
    fail("token file ", path, " is empty; regenerate it (nanoGPT's prepare.py or `shardlm prepare`)");
  }
  if (bytes.size() % 2 != 0) {
    fail("token file ", path, " has an odd number of bytes (", bytes.size(),
         ") so it is not a raw uint16 token file; it is truncated, or set data.format to llmc ",
         "if it is an llm.c .bin file");
  }
  return decode_u16(bytes.data(), bytes.size() / 2);
}

}  // namespace

TokenFormat parse_token_format(const std::string& name) {
  if (name == "llmc") return TokenFormat::LlmcBin;
  if (name == "raw_u16") return TokenFormat::RawU16;
  fail("unknown token file format '", name, "'; use \"llmc\" (llm.c .bin with a 1024-byte header) ",
       "or \"raw_u16\" (bare uint16 tokens, nanoGPT)");
}

const char* token_format_name(TokenFormat format) {
  return format == TokenFormat::LlmcBin ? "llmc" : "raw_u16";
}

std::vector<uint16_t> read_tokens(const std::string& path, TokenFormat format) {
  const std::vector<unsigned char> bytes = read_all(path);
  return format == TokenFormat::LlmcBin ? parse_llmc(path, bytes) : parse_raw(path, bytes);
}

void write_llmc_tokens(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.empty()) {
    fail("refusing to write ", path, " with no tokens: readers reject empty token files; ",
         "give `shardlm prepare` more text or a smaller --val-fraction");
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    fail("cannot write ", path, ": ", tokens.size(), " tokens exceed the llm.c header's int32 ",
         "count; split the input into several files");
  }
  std::vector<unsigned char> bytes(static_cast<size_t>(kLlmcHeaderBytes) + 2 * tokens.size(), 0);
  put_le_i32(bytes.data(), kLlmcMagic);
  put_le_i32(bytes.data() + 4, kLlmcVersion);
  put_le_i32(bytes.data() + 8, static_cast<int32_t>(tokens.size()));
  unsigned char* p = bytes.data() + kLlmcHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    p[2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
    p[2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
  }

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      fail("cannot create ", tmp, ": ", std::strerror(errno),
           "; check that the output folder exists and is writable");
    }
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      fail("cannot write ", tmp, " (", bytes.size(), " bytes); check free disk space and rerun");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("cannot rename ", tmp, " to ", path, ": ", ec.message(), "; check the folder's permissions");
  }
}

}  // namespace shardlm::data
