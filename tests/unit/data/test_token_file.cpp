// Token files: the llm.c layout byte for byte, and a distinct, actionable error for each way a file
// can be wrong (a wrong data.format and a half-copied file are the usual first-run mistakes).
#include <gtest/gtest.h>

#include <filesystem>

#include "data/token_file.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {

// An llm.c header with the given fields, as raw little-endian bytes.
std::vector<unsigned char> header(int32_t magic, int32_t version, int32_t count) {
  std::vector<unsigned char> h(1024, 0);
  const int32_t fields[3] = {magic, version, count};
  for (int f = 0; f < 3; ++f) {
    for (int b = 0; b < 4; ++b) h[4 * f + b] = static_cast<unsigned char>(static_cast<uint32_t>(fields[f]) >> (8 * b));
  }
  return h;
}

void append_u16(std::vector<unsigned char>& bytes, uint16_t v) {
  bytes.push_back(static_cast<unsigned char>(v & 0xff));
  bytes.push_back(static_cast<unsigned char>(v >> 8));
}

}  // namespace

TEST(TokenFormat, ParsesBothNamesAndListsThemOnError) {
  EXPECT_EQ(parse_token_format("llmc"), TokenFormat::LlmcBin);
  EXPECT_EQ(parse_token_format("raw_u16"), TokenFormat::RawU16);
  const std::string msg = error_message([] { parse_token_format("bin"); });
  EXPECT_TRUE(Contains(msg, "'bin'"));
  EXPECT_TRUE(Contains(msg, "llmc"));
  EXPECT_TRUE(Contains(msg, "raw_u16"));
}

TEST(TokenFile, LlmcRoundTripAndExactLayout) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 2, 255, 256, 4095, 65534, 65535, 7};
  write_llmc_tokens(dir.file("t.bin"), tokens);
  EXPECT_EQ(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin), tokens);
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.bin.tmp")));

  std::vector<unsigned char> expected = header(20240520, 1, static_cast<int32_t>(tokens.size()));
  for (uint16_t t : tokens) append_u16(expected, t);
  EXPECT_EQ(read_bytes(dir.file("t.bin")), expected);

  // Overwriting replaces the file whole.
  write_llmc_tokens(dir.file("t.bin"), {42});
  EXPECT_EQ(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin), std::vector<uint16_t>{42});
}

TEST(TokenFile, RawU16ReadsLittleEndianPairs) {
  TempDir dir;
  std::vector<unsigned char> bytes;
  for (uint16_t t : {3, 513, 65535}) append_u16(bytes, t);
  write_bytes(dir.file("raw.bin"), bytes);
  EXPECT_EQ(read_tokens(dir.file("raw.bin"), TokenFormat::RawU16), (std::vector<uint16_t>{3, 513, 65535}));
}

TEST(TokenFile, WritingNoTokensIsAnError) {
  TempDir dir;
  EXPECT_TRUE(Contains(error_message([&] { write_llmc_tokens(dir.file("e.bin"), {}); }), "no tokens"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("e.bin")));
}

TEST(TokenFileErrors, MissingFile) {
  TempDir dir;
  for (TokenFormat f : {TokenFormat::LlmcBin, TokenFormat::RawU16}) {
    const std::string msg = error_message([&] { read_tokens(dir.file("nope.bin"), f); });
    EXPECT_TRUE(Contains(msg, "nope.bin"));
    EXPECT_TRUE(Contains(msg, "does not exist"));
    EXPECT_TRUE(Contains(msg, "shardlm prepare"));
  }
}

TEST(TokenFileErrors, EmptyFile) {
  TempDir dir;
  write_bytes(dir.file("empty.bin"), {});
  for (TokenFormat f : {TokenFormat::LlmcBin, TokenFormat::RawU16}) {
    EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("empty.bin"), f); }), "is empty"));
  }
  // A well-formed header that announces zero tokens is just as unusable.
  write_bytes(dir.file("zero.bin"), header(20240520, 1, 0));
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("zero.bin"), TokenFormat::LlmcBin); }), "0 tokens"));
}

TEST(TokenFileErrors, ShorterThanHeader) {
  TempDir dir;
  write_bytes(dir.file("short.bin"), std::vector<unsigned char>(100, 1));
  const std::string msg = error_message([&] { read_tokens(dir.file("short.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "100 bytes"));
  EXPECT_TRUE(Contains(msg, "1024-byte"));
  EXPECT_TRUE(Contains(msg, "raw_u16"));
}

TEST(TokenFileErrors, WrongMagicSuggestsRawFormat) {
  TempDir dir;
  // A nanoGPT-style raw file: tokens from the first byte on.
  std::vector<unsigned char> raw;
  for (int i = 0; i < 1000; ++i) append_u16(raw, static_cast<uint16_t>(i));
  write_bytes(dir.file("raw.bin"), raw);
  const std::string msg = error_message([&] { read_tokens(dir.file("raw.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "raw.bin"));
  EXPECT_TRUE(Contains(msg, "magic number 65536"));  // tokens 0, 1 read as one int32
  EXPECT_TRUE(Contains(msg, "20240520"));
  EXPECT_TRUE(Contains(msg, "if this is a raw uint16 token file (nanoGPT), set data.format to raw_u16"));
  // Read as what it is, it works.
  EXPECT_EQ(read_tokens(dir.file("raw.bin"), TokenFormat::RawU16).size(), 1000u);
}

TEST(TokenFileErrors, UnsupportedVersion) {
  TempDir dir;
  std::vector<unsigned char> bytes = header(20240520, 2, 4);
  for (int i = 0; i < 4; ++i) append_u16(bytes, 1);
  write_bytes(dir.file("v2.bin"), bytes);
  const std::string msg = error_message([&] { read_tokens(dir.file("v2.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "version 2"));
  EXPECT_TRUE(Contains(msg, "only version 1"));
}

TEST(TokenFileErrors, TruncatedBody) {
  TempDir dir;
  write_llmc_tokens(dir.file("t.bin"), std::vector<uint16_t>(10, 5));
  std::filesystem::resize_file(dir.file("t.bin"), 1024 + 18);
  const std::string msg = error_message([&] { read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "truncated"));
  EXPECT_TRUE(Contains(msg, "header says 10 tokens = 20 bytes but the file has 18 bytes after the header"));
}

TEST(TokenFileErrors, ExtraBytes) {
  TempDir dir;
  std::vector<unsigned char> bytes = header(20240520, 1, 2);
  for (int i = 0; i < 3; ++i) append_u16(bytes, 9);
  write_bytes(dir.file("x.bin"), bytes);
  const std::string msg = error_message([&] { read_tokens(dir.file("x.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "2 extra bytes"));
  EXPECT_TRUE(Contains(msg, "header says 2 tokens = 4 bytes"));
}

TEST(TokenFileErrors, OddSizedRawFile) {
  TempDir dir;
  write_bytes(dir.file("odd.bin"), {1, 2, 3});
  const std::string msg = error_message([&] { read_tokens(dir.file("odd.bin"), TokenFormat::RawU16); });
  EXPECT_TRUE(Contains(msg, "odd number of bytes (3)"));
  EXPECT_TRUE(Contains(msg, "llmc"));
}

TEST(TokenFileErrors, DirectoryInsteadOfFile) {
  TempDir dir;
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.path().string(), TokenFormat::LlmcBin); }), "is a directory"));
}
