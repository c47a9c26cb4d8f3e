// tokenizer.json support: the ids and decodes of Python's `tokenizers` for every case that
// tests/reference/make_tokenizer_cases.py writes (fixture reference_tokenizer_cases, which ctest
// runs before these tests), the refusals of what is not implemented, and the special-id rules.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data/tokenizer/hf_text.h"
#include "data/tokenizer/hf_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "test_helpers.h"
#include "util/error.h"

namespace shardlm::data {
namespace {

using nlohmann::json;
using testing::TempDir;

std::string cases_dir() {
#ifdef SHARDLM_TOKENIZER_CASES_DIR
  return SHARDLM_TOKENIZER_CASES_DIR;
#else
  return "";
#endif
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(HfTokenizerParity, IdsAndDecodesEqualTokenizers) {
  const std::string dir = cases_dir();
  if (dir.empty() || !std::filesystem::exists(dir + "/index.json")) {
    FAIL() << "no golden cases in " << dir << ": ctest makes them first (fixture reference_tokenizer_cases); "
           << "run `ctest -R HfTokenizerParity`, or tests/reference/make_tokenizer_cases.py " << dir;
  }
  const json index = read_json(dir + "/index.json");
  ASSERT_GE(index["names"].size(), 19u);
  for (const auto& name_json : index["names"]) {
    const std::string name = name_json.get<std::string>();
    const std::string tdir = dir + "/" + name;
    SCOPED_TRACE(name);
    const HfTokenizer tok(tdir + "/tokenizer.json");
    const json cases = read_json(tdir + "/cases.json");
    EXPECT_EQ(tok.vocab_size(), cases["vocab_size"].get<int>());
    int mismatches = 0;
    for (const json& c : cases["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int> want = c["ids"].get<std::vector<int>>();
      const std::vector<int> got = tok.encode(text, c["add_special_tokens"].get<bool>());
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << "ids differ for " << json(text).dump() << "\n got  " << json(got).dump()
                      << "\n want " << json(want).dump();
      }
      if (tok.decode(want, false) != c["decode"].get<std::string>() && ++mismatches <= 5) {
        ADD_FAILURE() << "decode differs for " << json(want).dump();
      }
      if (tok.decode(want, true) != c["decode_skip"].get<std::string>() && ++mismatches <= 5) {
        ADD_FAILURE() << "decode(skip_special_tokens) differs for " << json(want).dump();
      }
    }
    EXPECT_EQ(mismatches, 0) << cases["cases"].size() << " cases";
    // The Tokenizer front end (folder path) gives the same ids.
    const Tokenizer front(tdir);
    EXPECT_TRUE(front.is_hf_json());
    EXPECT_EQ(front.encode(cases["cases"][0]["text"].get<std::string>()),
              tok.encode(cases["cases"][0]["text"].get<std::string>(), true));
  }
}

TEST(HfTokenizerParity, SpecialAndWellKnownIds) {
  const std::string dir = cases_dir();
  if (dir.empty() || !std::filesystem::exists(dir + "/index.json")) {
    FAIL() << "no golden cases in " << dir << ": ctest makes them first (fixture reference_tokenizer_cases); "
           << "run `ctest -R HfTokenizerParity`, or tests/reference/make_tokenizer_cases.py " << dir;
  }
  const Tokenizer llama3(dir + "/llama3_synth/tokenizer.json");
  EXPECT_EQ(llama3.bos_id(), llama3.encode("x").front());  // <|begin_of_text|> from the template
  EXPECT_GE(llama3.eos_id(), 0);                             // <|end_of_text|>
  const Tokenizer llama2(dir + "/llama2_legacy");
  EXPECT_EQ(llama2.bos_id(), 1);  // <s>
  EXPECT_EQ(llama2.eos_id(), 2);  // </s>
  const Tokenizer gpt2(dir + "/real_gpt2");
  EXPECT_EQ(gpt2.bos_id(), -1);  // GPT-2 adds nothing
  EXPECT_EQ(gpt2.eos_id(), 50256);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  const Tokenizer llama2_real(dir + "/real_llama2_spm_legacy/tokenizer.json");
  EXPECT_EQ(llama2_real.vocab_size(), 32000);
  EXPECT_EQ(llama2_real.bos_id(), 1);
  EXPECT_EQ(llama2_real.eos_id(), 2);
  EXPECT_EQ(llama2_real.encode("Hello world"), (std::vector<int>{1, 15043, 3186}));  // Llama 2's known ids
  const Tokenizer qwen2(dir + "/real_qwen2");
  EXPECT_EQ(qwen2.vocab_size(), 151646);
  EXPECT_EQ(qwen2.bos_id(), -1);
  EXPECT_EQ(qwen2.eos_id(), 151645);  // tokenizer_config.json's <|im_end|>
  EXPECT_EQ(qwen2.encode("Hello world"), (std::vector<int>{9707, 1879}));  // Qwen2's known ids
  const Tokenizer llama3_real(dir + "/real_llama3");
  EXPECT_EQ(llama3_real.vocab_size(), 128256);
  EXPECT_EQ(llama3_real.bos_id(), 128000);  // <|begin_of_text|> from the template
  EXPECT_EQ(llama3_real.eos_id(), 128001);  // <|end_of_text|>
  EXPECT_EQ(llama3_real.encode("Hello world"), (std::vector<int>{128000, 9906, 1917}));  // Llama 3's known ids
  EXPECT_EQ(llama3_real.encode("<|eot_id|>", false), (std::vector<int>{128009}));
  const Tokenizer mistral_v01(dir + "/real_mistral_v01");
  EXPECT_EQ(mistral_v01.vocab_size(), 32000);
  EXPECT_EQ(mistral_v01.bos_id(), 1);
  EXPECT_EQ(mistral_v01.eos_id(), 2);
  EXPECT_EQ(mistral_v01.encode("Hello world"), (std::vector<int>{1, 22557, 1526}));  // Mistral 7B v0.1's ids
  const Tokenizer mistral_v03(dir + "/real_mistral_v03");
  EXPECT_EQ(mistral_v03.vocab_size(), 32768);
  EXPECT_EQ(mistral_v03.bos_id(), 1);
  EXPECT_EQ(mistral_v03.eos_id(), 2);
  EXPECT_EQ(mistral_v03.encode("Hello world"), (std::vector<int>{1, 23325, 2294}));  // Mistral 7B v0.3's ids
  EXPECT_EQ(mistral_v03.encode("[INST]", false), (std::vector<int>{3}));             // a control token
}

// Every code point: PCRE2 with shardlm's translation matches \p{X} (and \s) exactly where
// tokenizers' Oniguruma does, and normalization agrees with tokenizers' normalizers on probes around
// every code point utf8proc normalizes (the Unicode versions of the libraries differ; see
// hf_unicode_tables.cpp).
TEST(HfTokenizerParity, UnicodeClassesAndNormalizationEqualTokenizers) {
  const std::string dir = cases_dir();
  if (dir.empty() || !std::filesystem::exists(dir + "/unicode.json")) {
    FAIL() << "no golden cases in " << dir << ": ctest makes them first (fixture reference_tokenizer_cases); "
           << "run `ctest -R HfTokenizerParity`, or tests/reference/make_tokenizer_cases.py " << dir;
  }
  const json u = read_json(dir + "/unicode.json");
  std::string all;
  for (char32_t c = 1; c < 0x110000; ++c) {
    if (c < 0xD800 || c >= 0xE000) hf::append_utf8(all, c);
  }
  ASSERT_GE(u["classes"].size(), 16u);
  for (const auto& [prop, want_ranges] : u["classes"].items()) {
    SCOPED_TRACE(prop);
    const hf::Regex re(prop == "s" ? std::string("\\s") : "\\p{" + prop + "}", "test");
    std::vector<std::pair<size_t, size_t>> found;
    re.find_all(all, found);
    std::vector<std::pair<char32_t, char32_t>> got;
    for (const auto& [b, e] : found) {
      size_t i = b;
      const char32_t c = hf::next_char(all, i);
      ASSERT_EQ(i, e);
      if (!got.empty() && got.back().second + 1 == c) {
        got.back().second = c;
      } else if (!got.empty() && got.back().second == 0xD7FF && c == 0xE000) {
        got.back().second = c;  // the surrogates are left out of the text
      } else {
        got.emplace_back(c, c);
      }
    }
    std::vector<std::pair<char32_t, char32_t>> want;
    for (const json& r : want_ranges) {
      const auto a = r[0].get<char32_t>(), b = r[1].get<char32_t>();
      if (!want.empty() && want.back().second == 0xD7FF && a == 0xE000) {
        want.back().second = b;
      } else {
        want.emplace_back(a, b);
      }
    }
    EXPECT_EQ(got, want);
  }
  const hf::NormForm forms[] = {hf::NormForm::NFC, hf::NormForm::NFD, hf::NormForm::NFKC, hf::NormForm::NFKD};
  int bad = 0;
  for (const json& row : u["normalization"]) {
    const std::string text = row[0].get<std::string>();
    for (int f = 0; f < 4; ++f) {
      if (hf::normalize_unicode(text, forms[f]) != row[f + 1].get<std::string>() && ++bad <= 5) {
        ADD_FAILURE() << "form " << f << " of " << json(text).dump();
      }
    }
  }
  EXPECT_EQ(bad, 0) << u["normalization"].size() << " probes";
}

// ---- hand-written files -----------------------------------------------------------------------

// A tiny BPE tokenizer.json: vocab a b ab abab, merges (a b) (ab ab), with `patch` merged in.
std::string write_tiny(const TempDir& dir, const json& patch, const std::string& name = "tokenizer.json") {
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", json::array()},
            {"normalizer", nullptr}, {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
            {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                       {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"abab", 3}}},
                       {"merges", json::array({"a b", json::array({"ab", "ab"})})}}}};
  j.merge_patch(patch);
  const std::string path = dir.file(name);
  std::ofstream(path) << j.dump();
  return path;
}

void expect_refused(const json& patch, const std::vector<std::string>& needles) {
  TempDir dir;
  const std::string path = write_tiny(dir, patch);
  try {
    HfTokenizer tok(path);
    ADD_FAILURE() << "accepted " << patch.dump();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    for (const std::string& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
  }
}

TEST(HfTokenizer, TinyFileEncodesByMergeRank) {
  TempDir dir;
  const HfTokenizer tok(write_tiny(dir, json::object()));
  EXPECT_EQ(tok.encode("ababa"), (std::vector<int>{3, 0}));
  EXPECT_EQ(tok.decode({3, 0}), "abab a");  // no decoder: tokens joined by spaces, as tokenizers
  EXPECT_EQ(tok.vocab_size(), 4);
}

// A word of 20000 characters goes through the heap-based merge loop (and past the cache's word
// length limit); the result is checked, the time is not (timings belong in bench/).
TEST(HfTokenizer, LongWordMergesCompletely) {
  TempDir dir;
  const HfTokenizer tok(write_tiny(dir, json::object()));
  std::string word;
  for (int i = 0; i < 10000; ++i) word += "ab";
  const std::vector<int> ids = tok.encode(word);
  EXPECT_EQ(ids, std::vector<int>(5000, 3));
}

TEST(HfTokenizer, RefusesUnimplementedComponentsNamingThem) {
  expect_refused({{"normalizer", {{"type", "Lowercase"}}}}, {"normalizer Lowercase"});
  expect_refused({{"normalizer", {{"type", "BertNormalizer"}, {"lowercase", true}}}}, {"normalizer BertNormalizer"});
  expect_refused({{"pre_tokenizer", {{"type", "BertPreTokenizer"}}}}, {"pre_tokenizer BertPreTokenizer"});
  expect_refused({{"pre_tokenizer", {{"type", "Whitespace"}}}}, {"pre_tokenizer Whitespace"});
  expect_refused({{"model", {{"type", "WordPiece"}}}}, {"model WordPiece"});
  expect_refused({{"model", {{"type", "Unigram"}}}}, {"model Unigram"});
  expect_refused({{"model", {{"dropout", 0.1}}}}, {"model BPE", "dropout"});
  expect_refused({{"model", {{"continuing_subword_prefix", "##"}}}}, {"model BPE", "continuing_subword_prefix"});
  expect_refused({{"model", {{"end_of_word_suffix", "</w>"}}}}, {"model BPE", "end_of_word_suffix"});
  expect_refused({{"post_processor", {{"type", "RobertaProcessing"}}}}, {"post_processor RobertaProcessing"});
  expect_refused({{"decoder", {{"type", "WordPiece"}}}}, {"decoder WordPiece"});
  expect_refused({{"truncation", {{"max_length", 8}}}}, {"truncation"});
  expect_refused({{"padding", {{"length", 8}}}}, {"padding"});
  expect_refused({{"version", "2.0"}}, {"version"});
  // Regex constructs whose meaning differs between Oniguruma and PCRE2.
  expect_refused({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}, {"invert", false}}}},
                 {"pre_tokenizer Split", "\\w"});
  expect_refused({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "^a"}}}, {"behavior", "Isolated"}, {"invert", false}}}},
                 {"pre_tokenizer Split", "anchor"});
  expect_refused({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\p{Han}+"}}}, {"behavior", "Isolated"}, {"invert", false}}}},
                 {"pre_tokenizer Split", "Han", "supported properties"});
  expect_refused({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"}, {"invert", false}}}},
                 {"pre_tokenizer Split", "\\d"});
}

TEST(HfTokenizer, RefusesUnknownKeysNamingComponentAndKey) {
  expect_refused({{"surprise", 1}}, {"the top level", "surprise"});
  expect_refused({{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"lowercase", true}}}},
                 {"pre_tokenizer ByteLevel", "lowercase"});
  expect_refused({{"normalizer", {{"type", "NFC"}, {"extra", true}}}}, {"normalizer NFC", "extra"});
  expect_refused({{"model", {{"cache_capacity", 5}}}}, {"model BPE", "cache_capacity"});
  expect_refused({{"decoder", {{"type", "Fuse"}, {"x", 1}}}}, {"decoder Fuse", "x"});
  expect_refused({{"added_tokens", json::array({{{"id", 4}, {"content", "<x>"}, {"special", true}, {"weird", 1}}})}},
                 {"added_tokens entry", "weird"});
}

TEST(HfTokenizer, RefusesAddedTokenIdsTokenizersWouldChange) {
  expect_refused({{"added_tokens", json::array({{{"id", 9}, {"content", "<x>"}, {"special", true}}})}},
                 {"added token <x>", "id 4"});
}

TEST(HfTokenizer, AddedTokensSplitBeforeTheModel) {
  TempDir dir;
  const HfTokenizer tok(write_tiny(
      dir, {{"added_tokens", json::array({{{"id", 4}, {"content", "<x>"}, {"special", true}, {"normalized", false}},
                                          {{"id", 5}, {"content", "<x>y"}, {"special", false}, {"normalized", false}}})}}));
  EXPECT_EQ(tok.encode("ab<x>ab<x>yab"), (std::vector<int>{2, 4, 2, 5, 2}));  // longest match wins
  EXPECT_EQ(tok.decode({2, 4, 2}, true), "ab ab");
  EXPECT_EQ(tok.vocab_size(), 6);
}

TEST(HfTokenizer, EosFromTokenizerConfigThenConfigThenNames) {
  TempDir dir;
  const json added = json::array({{{"id", 4}, {"content", "</s>"}, {"special", true}},
                                  {{"id", 5}, {"content", "<|im_end|>"}, {"special", true}}});
  write_tiny(dir, {{"added_tokens", added}});
  EXPECT_EQ(Tokenizer(dir.path().string()).eos_id(), 4);  // the well-known name </s>
  std::ofstream(dir.file("config.json")) << R"({"eos_token_id": [5, 4]})";
  EXPECT_EQ(Tokenizer(dir.path().string()).eos_id(), 5);
  std::ofstream(dir.file("tokenizer_config.json")) << R"({"eos_token": {"content": "</s>"}})";
  EXPECT_EQ(Tokenizer(dir.path().string()).eos_id(), 4);
  EXPECT_EQ(Tokenizer(dir.path().string()).bos_id(), -1);
}

// Before: the first conventional name found anywhere in the vocabulary was the eos, special or not
// (Phi-3's non-special "</s>"); now only a special added token of that name is, and a file beside
// the tokenizer that names the eos wins (generation_config.json included, a list gives its first).
TEST(HfTokenizer, EosByNameMustBeASpecialAddedToken) {
  TempDir dir;
  const json added = json::array({{{"id", 4}, {"content", "</s>"}, {"special", false}},
                                  {{"id", 5}, {"content", "<|endoftext|>"}, {"special", true}}});
  write_tiny(dir, {{"added_tokens", added}});
  const Tokenizer phi3_like(dir.path().string());
  EXPECT_EQ(phi3_like.eos_id(), 5);  // not the non-special </s>
  EXPECT_NE(phi3_like.eos_description().find("id 5 \"<|endoftext|>\""), std::string::npos) << phi3_like.eos_description();
  std::ofstream(dir.file("generation_config.json")) << R"({"eos_token_id": [4, 5]})";
  EXPECT_EQ(Tokenizer(dir.path().string()).eos_id(), 4);
  EXPECT_NE(Tokenizer(dir.path().string()).eos_source().find("generation_config.json"), std::string::npos);
  std::ofstream(dir.file("config.json")) << R"({"eos_token_id": 5})";  // generation_config.json comes first
  EXPECT_EQ(Tokenizer(dir.path().string()).eos_id(), 4);
  std::ofstream(dir.file("generation_config.json")) << R"({"eos_token_id": 99})";  // not an id of the file
  EXPECT_THROW(Tokenizer(dir.path().string()), Error);
  EXPECT_EQ(Tokenizer(dir.path().string(), "</s>").eos_id(), 4);  // --eos-token wins over every file
  EXPECT_THROW(Tokenizer(dir.path().string(), "<nope>"), Error);
  // "</s>" only as a plain vocabulary entry (Qwen2's BPE id 128247): no eos, and the reason names --eos-token.
  TempDir plain;
  write_tiny(plain, {{"model", {{"vocab", {{"</s>", 4}}}}}});
  const Tokenizer none(plain.path().string());
  EXPECT_EQ(none.eos_id(), -1);
  EXPECT_NE(none.no_eos_error().find("--eos-token"), std::string::npos) << none.no_eos_error();
}

TEST(HfTokenizerParity, Qwen2TokenizerJsonAloneEndsDocumentsWithEndoftext) {
  const std::string dir = cases_dir();
  if (dir.empty() || !std::filesystem::exists(dir + "/real_qwen2/tokenizer.json"))
    FAIL() << "no real_qwen2 case in " << dir << ": ctest makes it first (fixture reference_tokenizer_cases)";
  TempDir alone;  // the tokenizer.json without the tokenizer_config.json beside it
  std::filesystem::copy_file(dir + "/real_qwen2/tokenizer.json", alone.file("tokenizer.json"));
  const Tokenizer qwen2(alone.path().string());
  EXPECT_EQ(qwen2.eos_id(), 151643) << qwen2.eos_description();  // <|endoftext|>, not the BPE "</s>"
}

TEST(HfTokenizer, RefusesInvalidUtf8Input) {
  TempDir dir;
  const HfTokenizer tok(write_tiny(dir, json::object()));
  EXPECT_THROW(tok.encode(std::string("ab\xff")), Error);
}

}  // namespace
}  // namespace shardlm::data
