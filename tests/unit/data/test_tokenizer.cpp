// Tokenizer over the bundled Brown model: the wrapper must round-trip text exactly, report the
// model's ids, and agree with the token files scripts/make_corpus.sh wrote with spm_encode.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/loader/token_file.h"
#include "data/tokenizer/tokenizer.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

namespace {
const std::string kModel = source_path("data/brown/tokenizer.model");
}

TEST(Tokenizer, BundledModelShape) {
  const Tokenizer tok(kModel);
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.path(), kModel);
}

TEST(Tokenizer, RoundTripsText) {
  const Tokenizer tok(kModel);
  for (const std::string text : {
           "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election.",
           "He paid $29.50 on March 1, 1961; \"no evidence\" -- none!",
           "Zymurgy qux Xylophone 0123456789",
           "caf\xc3\xa9 na\xc3\xafve \xe6\x9d\xb1\xe4\xba\xac",  // not in the corpus: byte fallback
       }) {
    const std::vector<int> ids = tok.encode(text);
    ASSERT_FALSE(ids.empty());
    for (int id : ids) {
      EXPECT_GE(id, 3);  // no unk/bos/eos from plain text
      EXPECT_LT(id, 4096);
    }
    EXPECT_EQ(tok.decode(ids), text);
  }
  // Digits are split, one piece each (what split_digits promises).
  EXPECT_EQ(tok.encode("1961").size(), 5u);  // "▁" + four digits
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(Tokenizer, FirstTrainingDocumentDecodesToBrownsFirstParagraph) {
  const Tokenizer tok(kModel);
  const std::vector<uint32_t> train = read_tokens(source_path("data/brown/train.bin"), TokenFormat::LlmcBin).to_vector();
  const auto eos = std::find(train.begin(), train.end(), static_cast<uint32_t>(tok.eos_id()));
  ASSERT_NE(eos, train.end());
  const std::vector<int> first(train.begin(), eos);
  EXPECT_EQ(tok.decode(first),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
            "election produced \"no evidence\" that any irregularities took place.");
}

// Paths where sentencepiece might log: its logging must stay off in-process (see spm_isolated.h),
// so these must neither crash nor print.
TEST(Tokenizer, SurvivesOddInput) {
  const Tokenizer tok(kModel);
  const std::vector<int> ids = tok.encode(std::string("ok \xff\xfe bytes \xc3", 10));
  EXPECT_FALSE(ids.empty());
  EXPECT_NO_THROW(tok.decode(ids));
  EXPECT_EQ(tok.decode({1, 2}), "");                   // bos/eos decode to nothing
  EXPECT_NO_THROW(tok.decode({3 + 0xC3, 3 + 0x28}));   // byte pieces forming invalid UTF-8
  const std::string long_text(200000, 'a');
  EXPECT_EQ(tok.decode(tok.encode(long_text)), long_text);
}

TEST(TokenizerErrors, MissingInvalidAndOutOfRange) {
  TempDir dir;
  std::string msg = error_message([&] { Tokenizer t(dir.file("none.model")); });
  EXPECT_TRUE(Contains(msg, "none.model"));
  EXPECT_TRUE(Contains(msg, "does not exist"));

  write_text(dir.file("bad.model"), "this is not a protobuf");
  msg = error_message([&] { Tokenizer t(dir.file("bad.model")); });
  EXPECT_TRUE(Contains(msg, "cannot load tokenizer model"));
  EXPECT_TRUE(Contains(msg, "bad.model"));

  const Tokenizer tok(kModel);
  msg = error_message([&] { tok.decode({5, 4096}); });
  EXPECT_TRUE(Contains(msg, "token id 4096"));
  EXPECT_TRUE(Contains(msg, "different tokenizer"));
}
