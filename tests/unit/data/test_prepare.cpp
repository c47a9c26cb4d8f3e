// `shardlm prepare`'s pipeline: the document/eos/split rule, its errors, tokenizer training, and
// byte-identity with the bundled files that scripts/make_corpus.sh made through spm_encode + numpy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "data/prepare.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {

const std::string kModel = source_path("data/brown/tokenizer.model");

// Splits a token file's content back into documents at each eos.
std::vector<std::string> decode_documents(const Tokenizer& tok, const std::vector<uint32_t>& tokens) {
  std::vector<std::string> docs;
  std::vector<int> cur;
  for (uint32_t t : tokens) {
    if (static_cast<int>(t) == tok.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(static_cast<int>(t));
    }
  }
  EXPECT_TRUE(cur.empty()) << "token file does not end with eos";
  return docs;
}

}  // namespace

TEST(Prepare, OutputDecodesBackToTheInputLines) {
  TempDir dir;
  // Blank and whitespace-only lines are not documents; a CRLF ending is dropped; a second file
  // continues the document list in order.
  write_text(dir.file("a.txt"),
             "The jury said it did find that many of Georgia's laws are outmoded.\n"
             "\n"
             "   \t\n"
             "It recommended that legislators act \"to have these laws studied\".\r\n"
             "The grand jury commented on a number of other topics, among them the Atlanta police.\n");
  write_text(dir.file("b.txt"),
             "Merger proposed\n"
             "However, the jury said it believes \"these two offices should be combined\".\n"
             "The City Purchasing Department, the jury said, is lacking in experienced clerical personnel.\n"
             "It urged that the city take steps to remedy this problem.\n"
             "Nothing after this line");  // no final newline
  PrepareOptions opt;
  opt.inputs = {dir.file("a.txt"), dir.file("b.txt")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("out/nested");
  opt.val_fraction = 0.25;
  const PrepareResult r = prepare_corpus(opt);

  const std::vector<std::string> docs = {
      "The jury said it did find that many of Georgia's laws are outmoded.",
      "It recommended that legislators act \"to have these laws studied\".",
      "The grand jury commented on a number of other topics, among them the Atlanta police.",
      "Merger proposed",
      "However, the jury said it believes \"these two offices should be combined\".",
      "The City Purchasing Department, the jury said, is lacking in experienced clerical personnel.",
      "It urged that the city take steps to remedy this problem.",
      "Nothing after this line"};
  EXPECT_EQ(read_documents(opt.inputs), docs);
  EXPECT_EQ(r.documents, 8);
  EXPECT_EQ(r.val_documents, 2);  // llround(0.25 * 8)
  EXPECT_EQ(r.train_documents, 6);
  EXPECT_EQ(r.vocab_size, 4096);

  const Tokenizer tok(kModel);
  // A 4096-piece vocabulary keeps llm.c's 16-bit layout (version 1), what llm.c's GPT-2 files use.
  EXPECT_EQ(r.token_bits, 16);
  EXPECT_EQ(read_tokens(r.train_path, TokenFormat::LlmcBin).bits(), 16);
  const auto train = read_tokens(r.train_path, TokenFormat::LlmcBin).to_vector();
  const auto val = read_tokens(r.val_path, TokenFormat::LlmcBin).to_vector();
  EXPECT_EQ(r.train_path, dir.file("out/nested/train.bin"));
  EXPECT_EQ(static_cast<int64_t>(train.size()), r.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(val.size()), r.val_tokens);
  EXPECT_EQ(decode_documents(tok, train), std::vector<std::string>(docs.begin(), docs.begin() + 6));
  EXPECT_EQ(decode_documents(tok, val), std::vector<std::string>(docs.begin() + 6, docs.end()));

  // Exactly encode(doc) + eos per document, nothing else (no bos).
  std::vector<uint32_t> expected;
  for (size_t d = 0; d < 6; ++d) {
    for (int id : tok.encode(docs[d])) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(2);
  }
  EXPECT_EQ(train, expected);
}

TEST(Prepare, AtLeastOneValidationDocument) {
  TempDir dir;
  write_text(dir.file("t.txt"), "one\ntwo\nthree\n");
  PrepareOptions opt{{dir.file("t.txt")}, kModel, dir.file("out"), 0.05, 0};
  const PrepareResult r = prepare_corpus(opt);  // llround(0.15) = 0, raised to 1
  EXPECT_EQ(r.val_documents, 1);
  EXPECT_EQ(r.train_documents, 2);
}

TEST(PrepareErrors, BadArgumentsAndInputs) {
  TempDir dir;
  write_text(dir.file("t.txt"), "one\ntwo\n");
  write_text(dir.file("blank.txt"), "\n  \n\n");
  const auto run = [&](std::vector<std::string> inputs, double frac, std::string model = kModel) {
    return error_message([&] { prepare_corpus({inputs, model, dir.file("out"), frac, 0}); });
  };
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 0.0), "--val-fraction 0 must be between 0 and 1"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 1.0), "between 0 and 1"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 0.9), "leaves none for training"));
  std::string msg = run({dir.file("missing.txt")}, 0.5);
  EXPECT_TRUE(Contains(msg, "missing.txt"));
  EXPECT_TRUE(Contains(msg, "--input"));
  EXPECT_TRUE(Contains(run({dir.file("blank.txt")}, 0.5), "no non-empty lines"));
  EXPECT_TRUE(Contains(run({}, 0.5), "--input"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 0.5, dir.file("none.model")), "does not exist"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/train.bin")));
}

TEST(Prepare, TrainsATokenizerFirst) {
  // Text for training: the first 300 validation documents of the bundled corpus, decoded.
  const Tokenizer bundled(kModel);
  const auto val = read_tokens(source_path("data/brown/val.bin"), TokenFormat::LlmcBin).to_vector();
  std::vector<std::string> docs = decode_documents(bundled, val);
  docs.resize(300);
  TempDir dir;
  std::string text;
  for (const auto& d : docs) text += d + "\n";
  write_text(dir.file("t.txt"), text);

  PrepareOptions opt{{dir.file("t.txt")}, dir.file("tok/my.model"), dir.file("out"), 0.1, 400};
  const PrepareResult r = prepare_corpus(opt);
  EXPECT_EQ(r.vocab_size, 400);
  EXPECT_TRUE(std::filesystem::exists(dir.file("tok/my.vocab")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("tok/my.train.txt")));  // its input is cleaned up
  const Tokenizer mine(opt.tokenizer);
  EXPECT_EQ(mine.eos_id(), 2);
  const auto train = read_tokens(r.train_path, TokenFormat::LlmcBin).to_vector();
  EXPECT_EQ(decode_documents(mine, train), std::vector<std::string>(docs.begin(), docs.begin() + 270));

  opt.tokenizer = dir.file("tok/no_suffix");
  EXPECT_TRUE(Contains(error_message([&] { prepare_corpus(opt); }), "must end in .model"));
  opt.tokenizer = dir.file("tok/big.model");
  opt.train_vocab_size = 70000;
  EXPECT_TRUE(Contains(error_message([&] { prepare_corpus(opt); }), "[260, 65536]"));
}

// The contract with scripts/make_corpus.sh: same text + model -> the same bytes.
TEST(Prepare, ReproducesTheBundledBrownFilesByteForByte) {
  if (std::system("command -v xz > /dev/null 2>&1") != 0) GTEST_SKIP() << "xz not installed";
  TempDir dir;
  const std::string cmd = "xz -dc '" + source_path("data/brown/brown.txt.xz") + "' > '" + dir.file("brown.txt") + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // make_corpus.sh holds out the last 759 of 15667 documents (whole files); see data/brown/README.md.
  PrepareOptions opt{{dir.file("brown.txt")}, kModel, dir.file("out"), 759.0 / 15667.0, 0};
  const PrepareResult r = prepare_corpus(opt);
  EXPECT_EQ(r.documents, 15667);
  EXPECT_EQ(r.val_documents, 759);
  EXPECT_TRUE(read_bytes(r.train_path) == read_bytes(source_path("data/brown/train.bin")));
  EXPECT_TRUE(read_bytes(r.val_path) == read_bytes(source_path("data/brown/val.bin")));

  // Training the tokenizer here runs the same spm_train command on the same (training) documents.
  opt.tokenizer = dir.file("tok/tokenizer.model");
  opt.train_vocab_size = 4096;
  opt.out_dir = dir.file("out2");
  const PrepareResult r2 = prepare_corpus(opt);
  EXPECT_TRUE(read_bytes(opt.tokenizer) == read_bytes(kModel));
  EXPECT_TRUE(read_bytes(r2.train_path) == read_bytes(source_path("data/brown/train.bin")));
}
