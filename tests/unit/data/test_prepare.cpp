// `shardlm prepare`'s pipeline: the document/eos/split rule, its errors, tokenizer training, and
// byte-identity with the bundled files that scripts/make_corpus.sh made through spm_encode + numpy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <zlib.h>

#include "data/loader/token_file.h"
#include "data/prep/prepare.h"
#include "data/tokenizer/tokenizer.h"
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

void write_gzip(const std::string& path, const std::string& text) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(gz), Z_OK);
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
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("out");
  const PrepareResult r = prepare_corpus(opt);  // llround(0.15) = 0, raised to 1
  EXPECT_EQ(r.val_documents, 1);
  EXPECT_EQ(r.train_documents, 2);
}

TEST(PrepareErrors, BadArgumentsAndInputs) {
  TempDir dir;
  write_text(dir.file("t.txt"), "one\ntwo\n");
  write_text(dir.file("blank.txt"), "\n  \n\n");
  const auto run = [&](std::vector<std::string> inputs, double frac, std::string model = kModel) {
    PrepareOptions opt;
    opt.inputs = std::move(inputs);
    opt.tokenizer = std::move(model);
    opt.out_dir = dir.file("out");
    opt.val_fraction = frac;
    return error_message([&] { prepare_corpus(opt); });
  };
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, -0.1), "--val-fraction -0.1 must be in [0, 1)"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 1.0), "must be in [0, 1)"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 0.9), "leaves none for training"));
  std::string msg = run({dir.file("missing.txt")}, 0.5);
  EXPECT_TRUE(Contains(msg, "missing.txt"));
  EXPECT_TRUE(Contains(msg, "--input"));
  EXPECT_TRUE(Contains(run({dir.file("blank.txt")}, 0.5), "no non-empty lines"));
  EXPECT_TRUE(Contains(run({}, 0.5), "--input"));
  EXPECT_TRUE(Contains(run({dir.file("*.nothing")}, 0.5), "matches no file"));
  EXPECT_TRUE(Contains(run({dir.file("t.txt")}, 0.5, dir.file("none.model")), "does not exist"));
  // Nothing was written, and the output folder made for the run is gone again.
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}

TEST(Prepare, ValFractionZeroHoldsNothingOutAndOneDocumentIsACorpus) {
  TempDir dir;
  write_text(dir.file("one.txt"), "A single document is a corpus too.\n");
  std::filesystem::create_directories(dir.file("out"));
  write_text(dir.file("out/val.bin"), "an earlier prepare's validation file");
  write_text(dir.file("out/notes.txt"), "not a token file: kept");
  PrepareOptions opt;
  opt.inputs = {dir.file("one.txt")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("out");
  opt.val_fraction = 0.0;
  const PrepareResult r = prepare_corpus(opt);
  EXPECT_EQ(r.documents, 1);
  EXPECT_EQ(r.train_documents, 1);
  EXPECT_EQ(r.val_documents, 0);
  EXPECT_EQ(r.val_tokens, 0);
  EXPECT_TRUE(r.val_path.empty());
  EXPECT_TRUE(r.val_files.empty());
  // A stale val.bin next to the new train.bin would pair old validation text with new training text.
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/val.bin")));
  EXPECT_EQ(r.removed, std::vector<std::string>{dir.file("out/val.bin")});
  EXPECT_TRUE(std::filesystem::exists(dir.file("out/notes.txt")));
  const Tokenizer tok(kModel);
  std::vector<uint32_t> expected;
  for (int id : tok.encode("A single document is a corpus too.")) expected.push_back(static_cast<uint32_t>(id));
  expected.push_back(2);
  EXPECT_EQ(read_tokens(r.train_path, TokenFormat::LlmcBin).to_vector(), expected);
}

TEST(Prepare, ShardsHoldShardTokensEachAndReadBackAsOneSequence) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Document number " + std::to_string(i) + " says something about the jury.\n";
  write_text(dir.file("t.txt"), text);
  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("whole");
  opt.val_fraction = 0.1;
  const PrepareResult whole = prepare_corpus(opt);
  const auto train = read_tokens(whole.train_path, TokenFormat::LlmcBin).to_vector();
  const auto val = read_tokens(whole.val_path, TokenFormat::LlmcBin).to_vector();

  opt.out_dir = dir.file("shards");
  opt.shard_tokens = 50;
  const PrepareResult sharded = prepare_corpus(opt);
  EXPECT_EQ(sharded.train_path, dir.file("shards/train_*.bin"));
  EXPECT_EQ(sharded.val_path, dir.file("shards/val_*.bin"));
  const size_t shards = (train.size() + 49) / 50;
  ASSERT_EQ(sharded.train_files.size(), shards);
  for (size_t k = 0; k < shards; ++k) {
    char name[48];
    std::snprintf(name, sizeof name, "shards/train_%06zu.bin", k);
    EXPECT_EQ(sharded.train_files[k], dir.file(name));
    const Tokens shard = read_tokens(sharded.train_files[k], TokenFormat::LlmcBin);
    EXPECT_EQ(static_cast<size_t>(shard.size()), k + 1 < shards ? 50 : train.size() - 50 * (shards - 1));
  }
  // The pattern reads the shards as the one train.bin they replace.
  EXPECT_EQ(read_tokens(sharded.train_path, TokenFormat::LlmcBin).to_vector(), train);
  EXPECT_EQ(read_tokens(sharded.val_path, TokenFormat::LlmcBin).to_vector(), val);

  // Again with larger shards: the earlier run's extra shards go, so the pattern stays exact.
  opt.shard_tokens = 200;
  const PrepareResult fewer = prepare_corpus(opt);
  EXPECT_LT(fewer.train_files.size(), shards);
  EXPECT_FALSE(fewer.removed.empty());
  EXPECT_EQ(read_tokens(fewer.train_path, TokenFormat::LlmcBin).to_vector(), train);
  EXPECT_EQ(read_tokens(fewer.val_path, TokenFormat::LlmcBin).to_vector(), val);
}

TEST(Prepare, JsonLinesGzipAndTextUnitsGiveTheSameDocuments) {
  TempDir dir;
  write_text(dir.file("a.jsonl"),
             "{\"text\": \"First document.\", \"id\": 1}\n"
             "\n"
             "{\"id\": 2, \"text\": \"Second one,\\nwith a newline and caf\\u00e9.\"}\r\n");
  write_gzip(dir.file("b.jsonl.gz"), "{\"text\": \"Third, from a gzipped file.\"}");
  write_text(dir.file("blocks.txt"), "First document.\n\n\nSecond one,\r\nwith a newline and caf\xc3\xa9.\n  \n");
  write_gzip(dir.file("whole.txt.gz"), "Third, from a gzipped file.");
  const std::vector<std::string> docs = {"First document.", "Second one,\nwith a newline and caf\xc3\xa9.",
                                         "Third, from a gzipped file."};
  EXPECT_EQ(read_documents({dir.file("a.jsonl"), dir.file("b.jsonl.gz")}), docs);
  DocumentOptions blocks;
  blocks.unit = TextUnit::Block;
  EXPECT_EQ(read_documents({dir.file("blocks.txt")}, blocks),
            std::vector<std::string>(docs.begin(), docs.begin() + 2));
  DocumentOptions whole;
  whole.unit = TextUnit::File;
  EXPECT_EQ(read_documents({dir.file("whole.txt.gz")}, whole), std::vector<std::string>{docs[2]});
  EXPECT_EQ(read_documents({dir.file("blocks.txt")}, whole),
            std::vector<std::string>{"First document.\n\n\nSecond one,\r\nwith a newline and caf\xc3\xa9.\n  \n"});
  // Globs expand in sorted order: a.jsonl, then b.jsonl.gz.
  EXPECT_EQ(read_documents({dir.file("*.jsonl*")}), docs);

  // Lines far longer than the reader's 128 KiB chunk, in a gzipped file too, come back whole.
  const std::string long_text(300000, 'a');
  write_text(dir.file("long.jsonl"), "{\"text\": \"" + long_text + "\"}\n{\"text\": \"after\"}");
  write_gzip(dir.file("long.txt.gz"), long_text + "\r\n" + long_text + "b");
  EXPECT_EQ(read_documents({dir.file("long.jsonl")}), (std::vector<std::string>{long_text, "after"}));
  EXPECT_EQ(read_documents({dir.file("long.txt.gz")}), (std::vector<std::string>{long_text, long_text + "b"}));

  // A field other than "text".
  write_text(dir.file("c.jsonl"), "{\"content\": \"Named otherwise.\"}\n");
  DocumentOptions content;
  content.text_field = "content";
  EXPECT_EQ(read_documents({dir.file("c.jsonl")}, content), std::vector<std::string>{"Named otherwise."});

  // prepare over JSON lines = prepare over the same documents as text lines.
  write_text(dir.file("same.txt"), "First document.\nThird, from a gzipped file.\n");
  write_text(dir.file("same.jsonl"), "{\"text\": \"First document.\"}\n{\"text\": \"Third, from a gzipped file.\"}\n");
  PrepareOptions opt;
  opt.tokenizer = kModel;
  opt.val_fraction = 0.0;
  opt.inputs = {dir.file("same.txt")};
  opt.out_dir = dir.file("txt");
  const PrepareResult a = prepare_corpus(opt);
  opt.inputs = {dir.file("same.jsonl")};
  opt.out_dir = dir.file("jsonl");
  const PrepareResult b = prepare_corpus(opt);
  EXPECT_TRUE(read_bytes(a.train_path) == read_bytes(b.train_path));
}

TEST(PrepareErrors, BadLinesAreNamedOrSkippedAndNothingIsWritten) {
  TempDir dir;
  write_text(dir.file("bad.jsonl"),
             "{\"text\": \"good one\"}\n"
             "{\"text\": \"broken\"\n"
             "[1, 2]\n"
             "{\"body\": \"x\", \"meta\": 3}\n"
             "{\"text\": 7}\n"
             "{\"text\": \"   \"}\n"
             "{\"text\": \"bad \xff byte\"}\n"
             "{\"text\": \"good two\"}\n");
  // Each bad line alone: the message names the file, the line and what is wrong.
  const std::vector<std::pair<int, std::string>> cases = {
      {2, "is not valid JSON"}, {3, "is a JSON array, not an object"}, {4, "has no field \"text\" (its fields: body, meta)"},
      {5, "field \"text\" is a JSON number, not a string"}, {6, "field \"text\" is empty"}, {7, "is not valid JSON"}};
  const std::vector<std::string> lines = [&] {
    std::vector<std::string> out;
    const std::vector<unsigned char> bytes = read_bytes(dir.file("bad.jsonl"));
    const std::string all(bytes.begin(), bytes.end());
    size_t at = 0;
    for (size_t nl; (nl = all.find('\n', at)) != std::string::npos; at = nl + 1) out.push_back(all.substr(at, nl - at));
    return out;
  }();
  for (const auto& [line, what] : cases) {
    write_text(dir.file("one.jsonl"), lines[0] + "\n" + std::string(lines[static_cast<size_t>(line - 1)]) + "\n");
    const std::string msg = error_message([&] { read_documents({dir.file("one.jsonl")}); });
    EXPECT_TRUE(Contains(msg, dir.file("one.jsonl") + " line 2: " + what)) << "case line " << line;
    EXPECT_TRUE(Contains(msg, "--skip-bad-lines"));
  }
  // Skipped and counted.
  DocumentOptions skip;
  skip.skip_bad_lines = true;
  DocumentReader reader({dir.file("bad.jsonl")}, skip);
  std::vector<std::string> docs;
  for (std::string d; reader.next(&d);) docs.push_back(d);
  EXPECT_EQ(docs, (std::vector<std::string>{"good one", "good two"}));
  EXPECT_EQ(reader.skipped(), 6);

  // Text that is not UTF-8 (Latin-1 here) is refused, never repaired.
  write_text(dir.file("latin1.txt"), "fine\ncaf\xe9\n");
  std::string msg = error_message([&] { read_documents({dir.file("latin1.txt")}); });
  EXPECT_TRUE(Contains(msg, "latin1.txt line 2: is not valid UTF-8 (byte 0xe9 at byte 3 of the line)"));
  EXPECT_TRUE(Contains(msg, "iconv"));
  EXPECT_EQ(read_documents({dir.file("latin1.txt")}, skip), std::vector<std::string>{"fine"});

  // A truncated gzip stream is an error, not a shorter corpus.
  {
    write_gzip(dir.file("full.jsonl.gz"), std::string(20000, 'x'));
    const auto bytes = read_bytes(dir.file("full.jsonl.gz"));
    write_bytes(dir.file("cut.txt.gz"), std::vector<unsigned char>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  }
  EXPECT_TRUE(Contains(error_message([&] { read_documents({dir.file("cut.txt.gz")}); }), "truncated or corrupt"));

  // prepare stops before writing: an existing train.bin is left as it was.
  std::filesystem::create_directories(dir.file("out"));
  write_text(dir.file("out/train.bin"), "old");
  PrepareOptions opt;
  opt.inputs = {dir.file("bad.jsonl")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("out");
  EXPECT_TRUE(Contains(error_message([&] { prepare_corpus(opt); }), "bad.jsonl line 2"));
  const std::vector<unsigned char> kept = read_bytes(dir.file("out/train.bin"));
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.file("out")), {}), 1);  // no staging file left
  opt.documents.skip_bad_lines = true;
  opt.val_fraction = 0.0;
  const PrepareResult r = prepare_corpus(opt);
  EXPECT_EQ(r.documents, 2);
  EXPECT_EQ(r.skipped_lines, 6);
  EXPECT_EQ(r.skipped_files, 0);

  // An empty part of a glob stops the run, or with --skip-bad-lines is skipped and counted.
  std::filesystem::create_directories(dir.file("parts"));
  write_text(dir.file("parts/a.jsonl"), "");
  write_text(dir.file("parts/b.jsonl"), "{\"text\": \"the only document\"}\n");
  opt.inputs = {dir.file("parts/*.jsonl")};
  opt.documents.skip_bad_lines = false;
  EXPECT_TRUE(Contains(error_message([&] { prepare_corpus(opt); }), "a.jsonl has no non-empty lines"));
  opt.documents.skip_bad_lines = true;
  const PrepareResult parts = prepare_corpus(opt);
  EXPECT_EQ(parts.documents, 1);
  EXPECT_EQ(parts.skipped_files, 1);
  // A name holding glob characters that exists is that file, not a pattern.
  write_text(dir.file("odd[1].jsonl"), "{\"text\": \"bracketed\"}\n");
  EXPECT_EQ(read_documents({dir.file("odd[1].jsonl")}), std::vector<std::string>{"bracketed"});
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

  PrepareOptions opt;
  opt.inputs = {dir.file("t.txt")};
  opt.tokenizer = dir.file("tok/my.model");
  opt.out_dir = dir.file("out");
  opt.val_fraction = 0.1;
  opt.train_vocab_size = 400;
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
  PrepareOptions opt;
  opt.inputs = {dir.file("brown.txt")};
  opt.tokenizer = kModel;
  opt.out_dir = dir.file("out");
  opt.val_fraction = 759.0 / 15667.0;
  const PrepareResult r = prepare_corpus(opt);
  EXPECT_EQ(r.documents, 15667);
  EXPECT_EQ(r.val_documents, 759);
  EXPECT_TRUE(read_bytes(r.train_path) == read_bytes(source_path("data/brown/train.bin")));
  EXPECT_TRUE(read_bytes(r.val_path) == read_bytes(source_path("data/brown/val.bin")));
  // The same bytes on one thread and on three: encoding in parallel keeps the input's order.
  for (int threads : {1, 3}) {
    PrepareOptions t = opt;
    t.threads = threads;
    t.out_dir = dir.file("threads" + std::to_string(threads));
    const PrepareResult rt = prepare_corpus(t);
    EXPECT_TRUE(read_bytes(rt.train_path) == read_bytes(source_path("data/brown/train.bin"))) << threads;
  }

  // Training the tokenizer here runs the same spm_train command on the same (training) documents.
  opt.tokenizer = dir.file("tok/tokenizer.model");
  opt.train_vocab_size = 4096;
  opt.out_dir = dir.file("out2");
  const PrepareResult r2 = prepare_corpus(opt);
  EXPECT_TRUE(read_bytes(opt.tokenizer) == read_bytes(kModel));
  EXPECT_TRUE(read_bytes(r2.train_path) == read_bytes(source_path("data/brown/train.bin")));
}
