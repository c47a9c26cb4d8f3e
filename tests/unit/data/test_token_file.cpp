// Token files: both llm.c layouts (16- and 32-bit ids) byte for byte, the raw layouts, the checks
// against a model's vocabulary, and a distinct, actionable error for each way a file can be wrong
// (a wrong data.format and a half-copied file are the usual first-run mistakes).
#include <gtest/gtest.h>

#include <filesystem>

#include "data/loader/token_file.h"
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

void append_u32(std::vector<unsigned char>& bytes, uint32_t v) {
  for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<unsigned char>(v >> (8 * b)));
}

}  // namespace

TEST(TokenFormat, ParsesTheNamesAndListsThemOnError) {
  EXPECT_EQ(parse_token_format("llmc"), TokenFormat::LlmcBin);
  EXPECT_EQ(parse_token_format("raw_u16"), TokenFormat::RawU16);
  EXPECT_EQ(parse_token_format("raw_u32"), TokenFormat::RawU32);
  for (TokenFormat f : {TokenFormat::LlmcBin, TokenFormat::RawU16, TokenFormat::RawU32})
    EXPECT_EQ(parse_token_format(token_format_name(f)), f);
  const std::string msg = error_message([] { parse_token_format("bin"); });
  EXPECT_TRUE(Contains(msg, "'bin'"));
  EXPECT_TRUE(Contains(msg, "llmc"));
  EXPECT_TRUE(Contains(msg, "raw_u16"));
  EXPECT_TRUE(Contains(msg, "raw_u32"));
}

TEST(TokenFile, LlmcRoundTripAndExactLayout) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 1, 2, 255, 256, 4095, 65534, 65535, 7};
  write_llmc_tokens(dir.file("t.bin"), tokens);  // 16-bit unless asked, as llm.c's write_datafile
  const Tokens read = read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin);
  EXPECT_EQ(read.bits(), 16);
  EXPECT_EQ(read.source(), dir.file("t.bin"));
  EXPECT_EQ(read.to_vector(), tokens);
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.bin.tmp")));

  std::vector<unsigned char> expected = header(20240520, 1, static_cast<int32_t>(tokens.size()));
  for (uint32_t t : tokens) append_u16(expected, static_cast<uint16_t>(t));
  EXPECT_EQ(read_bytes(dir.file("t.bin")), expected);

  // Overwriting replaces the file whole.
  write_llmc_tokens(dir.file("t.bin"), {42}, 16);
  EXPECT_EQ(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin).to_vector(), std::vector<uint32_t>{42});
}

// llm.c's Llama-3 layout: magic 20240801, version 7, little-endian uint32 ids; ids past 16 bits and
// the largest uint32 come back exactly.
TEST(TokenFile, Llmc32RoundTripAndExactLayout) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 70000, 128000, 128255, 16777216, 4294967295u, 3};
  write_llmc_tokens(dir.file("w.bin"), tokens, 32);
  std::vector<unsigned char> expected = header(20240801, 7, static_cast<int32_t>(tokens.size()));
  for (uint32_t t : tokens) append_u32(expected, t);
  EXPECT_EQ(read_bytes(dir.file("w.bin")), expected);

  const Tokens read = read_tokens(dir.file("w.bin"), TokenFormat::LlmcBin);
  EXPECT_EQ(read.bits(), 32);
  EXPECT_EQ(read.size(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(read.to_vector(), tokens);
  EXPECT_EQ(read[6], 16777216u);
  std::vector<int64_t> wide(3);
  read.widen(5, 3, wide.data());
  EXPECT_EQ(wide, (std::vector<int64_t>{128255, 16777216, 4294967295LL}));
}

TEST(TokenFile, RawU16ReadsLittleEndianPairs) {
  TempDir dir;
  std::vector<unsigned char> bytes;
  for (uint16_t t : {3, 513, 65535}) append_u16(bytes, t);
  write_bytes(dir.file("raw.bin"), bytes);
  const Tokens read = read_tokens(dir.file("raw.bin"), TokenFormat::RawU16);
  EXPECT_EQ(read.bits(), 16);
  EXPECT_EQ(read.to_vector(), (std::vector<uint32_t>{3, 513, 65535}));
}

TEST(TokenFile, RawU32ReadsLittleEndianQuads) {
  TempDir dir;
  std::vector<unsigned char> bytes;
  for (uint32_t t : {3u, 65536u, 128255u, 0x01020304u}) append_u32(bytes, t);
  write_bytes(dir.file("raw.bin"), bytes);
  const Tokens read = read_tokens(dir.file("raw.bin"), TokenFormat::RawU32);
  EXPECT_EQ(read.bits(), 32);
  EXPECT_EQ(read.to_vector(), (std::vector<uint32_t>{3, 65536, 128255, 0x01020304}));
}

// Copies share the mapping, which outlives the Tokens it was read into.
TEST(TokenFile, CopiesShareTheMapping) {
  TempDir dir;
  write_llmc_tokens(dir.file("t.bin"), {5, 6, 7}, 32);
  std::unique_ptr<Tokens> first = std::make_unique<Tokens>(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin));
  const Tokens copy = *first;
  first.reset();
  std::filesystem::remove(dir.file("t.bin"));
  EXPECT_EQ(copy.to_vector(), (std::vector<uint32_t>{5, 6, 7}));
}

TEST(TokenFile, WidthForAVocabulary) {
  EXPECT_EQ(llmc_bits_for_vocab(4096), 16);
  EXPECT_EQ(llmc_bits_for_vocab(50257), 16);   // GPT-2
  EXPECT_EQ(llmc_bits_for_vocab(65536), 16);   // ids 0..65535 all fit
  EXPECT_EQ(llmc_bits_for_vocab(65537), 32);
  EXPECT_EQ(llmc_bits_for_vocab(128256), 32);  // Llama 3
}

TEST(TokenFile, WritingAWideIdAs16BitIsRefused) {
  TempDir dir;
  const std::string msg = error_message([&] { write_llmc_tokens(dir.file("t.bin"), {1, 2, 65536}, 16); });
  EXPECT_TRUE(Contains(msg, "token 65536 at position 2"));
  EXPECT_TRUE(Contains(msg, "32-bit"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.bin")));
  EXPECT_TRUE(Contains(error_message([&] { write_llmc_tokens(dir.file("t.bin"), {1}, 8); }), "16- or 32-bit"));
}

TEST(TokenFile, WritingNoTokensIsAnError) {
  TempDir dir;
  EXPECT_TRUE(Contains(error_message([&] { write_llmc_tokens(dir.file("e.bin"), {}); }), "no tokens"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("e.bin")));
}

TEST(TokenFileErrors, MissingFile) {
  TempDir dir;
  for (TokenFormat f : {TokenFormat::LlmcBin, TokenFormat::RawU16, TokenFormat::RawU32}) {
    const std::string msg = error_message([&] { read_tokens(dir.file("nope.bin"), f); });
    EXPECT_TRUE(Contains(msg, "nope.bin"));
    EXPECT_TRUE(Contains(msg, "does not exist"));
    EXPECT_TRUE(Contains(msg, "shardlm prepare"));
  }
}

TEST(TokenFileErrors, EmptyFile) {
  TempDir dir;
  write_bytes(dir.file("empty.bin"), {});
  for (TokenFormat f : {TokenFormat::LlmcBin, TokenFormat::RawU16, TokenFormat::RawU32}) {
    EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("empty.bin"), f); }), "is empty"));
  }
  // A well-formed header that announces zero tokens is just as unusable.
  write_bytes(dir.file("zero.bin"), header(20240520, 1, 0));
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("zero.bin"), TokenFormat::LlmcBin); }), "0 tokens"));
  write_bytes(dir.file("zero32.bin"), header(20240801, 7, 0));
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("zero32.bin"), TokenFormat::LlmcBin); }), "0 tokens"));
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
  EXPECT_TRUE(Contains(msg, "20240801"));
  EXPECT_TRUE(Contains(msg, "if this is a raw uint16 token file (nanoGPT), set data.format to raw_u16"));
  EXPECT_TRUE(Contains(msg, "raw_u32"));
  // Read as what it is, it works.
  EXPECT_EQ(read_tokens(dir.file("raw.bin"), TokenFormat::RawU16).size(), 1000);
}

// Each magic goes with one version (llm.c: 20240520 with 1, 20240801 with 7); any other pairing is
// a corrupt header, named with the version llm.c writes under that magic.
TEST(TokenFileErrors, UnsupportedVersion) {
  TempDir dir;
  std::vector<unsigned char> bytes = header(20240520, 2, 4);
  for (int i = 0; i < 4; ++i) append_u16(bytes, 1);
  write_bytes(dir.file("v2.bin"), bytes);
  std::string msg = error_message([&] { read_tokens(dir.file("v2.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "v2.bin"));
  EXPECT_TRUE(Contains(msg, "version 2 under magic 20240520"));
  EXPECT_TRUE(Contains(msg, "only with version 1 (uint16 ids)"));

  for (auto [magic, version] : {std::pair{20240520, 7}, std::pair{20240801, 1}}) {
    bytes = header(magic, version, 2);
    for (int i = 0; i < 2; ++i) append_u32(bytes, 1);
    write_bytes(dir.file("mixed.bin"), bytes);
    msg = error_message([&] { read_tokens(dir.file("mixed.bin"), TokenFormat::LlmcBin); });
    EXPECT_TRUE(Contains(msg, "version " + std::to_string(version) + " under magic " + std::to_string(magic)));
    EXPECT_TRUE(Contains(msg, magic == 20240801 ? "only with version 7 (uint32 ids)" : "only with version 1"));
  }
}

TEST(TokenFileErrors, TruncatedBody) {
  TempDir dir;
  write_llmc_tokens(dir.file("t.bin"), std::vector<uint32_t>(10, 5));
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

// A 32-bit file's count is checked at 4 bytes a token: read as 16-bit it would look twice as long.
TEST(TokenFileErrors, WrongCountIn32BitFile) {
  TempDir dir;
  write_llmc_tokens(dir.file("t.bin"), std::vector<uint32_t>(10, 70000), 32);
  std::filesystem::resize_file(dir.file("t.bin"), 1024 + 38);
  std::string msg = error_message([&] { read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "t.bin is truncated"));
  EXPECT_TRUE(Contains(msg, "header says 10 tokens = 40 bytes but the file has 38 bytes after the header"));

  std::vector<unsigned char> bytes = header(20240801, 7, 5);
  for (int i = 0; i < 10; ++i) append_u32(bytes, 1);  // the count of a 16-bit reading of 10 ids
  write_bytes(dir.file("x.bin"), bytes);
  msg = error_message([&] { read_tokens(dir.file("x.bin"), TokenFormat::LlmcBin); });
  EXPECT_TRUE(Contains(msg, "20 extra bytes"));
  EXPECT_TRUE(Contains(msg, "header says 5 tokens = 20 bytes"));
}

TEST(TokenFileErrors, OddSizedRawFile) {
  TempDir dir;
  write_bytes(dir.file("odd.bin"), {1, 2, 3});
  std::string msg = error_message([&] { read_tokens(dir.file("odd.bin"), TokenFormat::RawU16); });
  EXPECT_TRUE(Contains(msg, "odd number of bytes (3)"));
  EXPECT_TRUE(Contains(msg, "llmc"));
  write_bytes(dir.file("six.bin"), {1, 2, 3, 4, 5, 6});
  msg = error_message([&] { read_tokens(dir.file("six.bin"), TokenFormat::RawU32); });
  EXPECT_TRUE(Contains(msg, "six.bin has 6 bytes, not a multiple of 4"));
  EXPECT_TRUE(Contains(msg, "raw_u16"));
}

TEST(TokenFileErrors, DirectoryInsteadOfFile) {
  TempDir dir;
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.path().string(), TokenFormat::LlmcBin); }), "is a directory"));
}

// The checks a run makes against its model's vocabulary. Llama 3 has 128256 ids: a 16-bit file
// cannot hold them, whatever ids it happens to contain.
TEST(TokenIds, SixteenBitFileIsRefusedForAVocabularyPast16Bits) {
  TempDir dir;
  write_llmc_tokens(dir.file("gpt2.bin"), {1, 2, 3}, 16);
  std::vector<unsigned char> raw;
  for (uint16_t t : {1, 2, 3}) append_u16(raw, t);
  write_bytes(dir.file("raw.bin"), raw);
  for (const auto& [name, format] : {std::pair{"gpt2.bin", TokenFormat::LlmcBin}, std::pair{"raw.bin", TokenFormat::RawU16}}) {
    const Tokens tokens = read_tokens(dir.file(name), format);
    const std::string msg = error_message([&] { check_token_ids(tokens, 128256); });
    EXPECT_TRUE(Contains(msg, dir.file(name)));
    EXPECT_TRUE(Contains(msg, "16-bit ids"));
    EXPECT_TRUE(Contains(msg, "vocab_size is 128256"));
    EXPECT_TRUE(Contains(msg, "Prepare 32-bit tokens"));
    EXPECT_TRUE(Contains(msg, "raw_u32"));
    EXPECT_NO_THROW(check_token_ids(tokens, 65536));  // exactly 16 bits of ids: fits
    EXPECT_NO_THROW(check_token_ids(tokens, 4));
  }
  write_llmc_tokens(dir.file("llama3.bin"), {1, 2, 128255}, 32);
  EXPECT_NO_THROW(check_token_ids(read_tokens(dir.file("llama3.bin"), TokenFormat::LlmcBin), 128256));
}

TEST(TokenIds, AnIdPastTheVocabularyIsNamedWithItsPosition) {
  TempDir dir;
  write_llmc_tokens(dir.file("w.bin"), {5, 128255, 7, 128256, 200000}, 32);
  const Tokens wide = read_tokens(dir.file("w.bin"), TokenFormat::LlmcBin);
  std::string msg = error_message([&] { check_token_ids(wide, 128256); });
  EXPECT_TRUE(Contains(msg, dir.file("w.bin")));
  EXPECT_TRUE(Contains(msg, "token 128256 at position 3 (0-based token index)"));  // the first one
  EXPECT_TRUE(Contains(msg, "vocab_size 128256"));
  EXPECT_TRUE(Contains(msg, "shardlm prepare"));
  EXPECT_NO_THROW(check_token_ids(wide, 200001));

  write_llmc_tokens(dir.file("n.bin"), {0, 999, 1000, 3}, 16);
  msg = error_message([&] { check_token_ids(read_tokens(dir.file("n.bin"), TokenFormat::LlmcBin), 1000); });
  EXPECT_TRUE(Contains(msg, "token 1000 at position 2"));
  EXPECT_TRUE(Contains(msg, "vocab_size 1000"));
}

TEST(TokenFile, ShardsReadThroughAPatternAsOneSequence) {
  TempDir dir;
  // Three shards, one of them 32-bit: a window may span files, whatever their widths.
  write_llmc_tokens(dir.file("train_000000.bin"), {1, 2, 3});
  write_llmc_tokens(dir.file("train_000001.bin"), {4, 70000}, 32);
  write_llmc_tokens(dir.file("train_000002.bin"), {6, 7, 8, 9});
  write_llmc_tokens(dir.file("other.bin"), {99});
  const Tokens t = read_tokens(dir.file("train_*.bin"), TokenFormat::LlmcBin);
  EXPECT_EQ(t.size(), 9);
  EXPECT_EQ(t.segments().size(), 3u);
  EXPECT_EQ(t.bits(), 16);
  EXPECT_EQ(t.source(), dir.file("train_*.bin") + " (3 files)");
  EXPECT_EQ(t.to_vector(), (std::vector<uint32_t>{1, 2, 3, 4, 70000, 6, 7, 8, 9}));
  std::vector<int64_t> w(6);
  t.widen(2, 6, w.data());
  EXPECT_EQ(w, (std::vector<int64_t>{3, 4, 70000, 6, 7, 8}));
  EXPECT_EQ(t[4], 70000u);
  EXPECT_EQ(t[8], 9u);

  // The checks name the file that fails them.
  std::string msg = error_message([&] { check_token_ids(t, 100000); });
  EXPECT_TRUE(Contains(msg, dir.file("train_000000.bin") + " holds 16-bit ids"));
  msg = error_message([&] { check_token_ids(t, 65536); });
  EXPECT_TRUE(Contains(msg, dir.file("train_000001.bin") + ": token 70000 at position 1"));
  EXPECT_TRUE(Contains(error_message([&] { read_tokens(dir.file("val_*.bin"), TokenFormat::LlmcBin); }),
                       "matches no file"));
}

TEST(TokenFile, WriterLeavesTheOldFileUntilCommitAndNoTemporaryOnError) {
  TempDir dir;
  write_llmc_tokens(dir.file("t.bin"), {5, 6});
  {
    LlmcTokenWriter w(dir.file("t.bin"), 16);
    const uint32_t ids[2] = {1, 70000};
    EXPECT_TRUE(Contains(error_message([&] { w.append(ids, 2); }), "does not fit"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.bin.tmp")));
  EXPECT_EQ(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin).to_vector(), (std::vector<uint32_t>{5, 6}));
  LlmcTokenWriter w(dir.file("t.bin"), 32);
  const uint32_t ids[3] = {1, 2, 3};
  w.append(ids, 2);
  w.append(ids + 2, 1);
  EXPECT_EQ(read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin).to_vector(), (std::vector<uint32_t>{5, 6}));
  w.commit();
  const Tokens t = read_tokens(dir.file("t.bin"), TokenFormat::LlmcBin);
  EXPECT_EQ(t.bits(), 32);
  EXPECT_EQ(t.to_vector(), (std::vector<uint32_t>{1, 2, 3}));
}
