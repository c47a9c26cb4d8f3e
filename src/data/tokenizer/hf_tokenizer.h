// A Hugging Face tokenizer.json, run in C++ with the token ids of the Python `tokenizers` library
// (Tokenizer::encode / decode) for the BPE pipelines of GPT-2, Llama 2/3, Mistral, Qwen2 and
// TinyLlama. What a file asks for that is not implemented here is refused when it is loaded,
// naming the component and the file, never approximated. Implemented:
//   normalizer     null, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence
//   pre_tokenizer  null, ByteLevel, Split (String or Regex pattern, every behavior, invert),
//                  Metaspace, Sequence
//   model          BPE (byte_fallback, unk_token, fuse_unk, ignore_merges; no dropout, no
//                  continuing_subword_prefix / end_of_word_suffix)
//   post_processor null, ByteLevel, TemplateProcessing (single template), Sequence of these
//   decoder        null, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence
//   added_tokens   single_word, lstrip, rstrip, normalized, special (matched in the raw text first,
//                  as tokenizers' AddedVocabulary), truncation and padding only as null.
// Regexes run on PCRE2 (JIT) with a translation to Oniguruma's meaning, see hf_text.h.
// Thread safety: encode/decode are const and may run concurrently (the word cache is per thread).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::data {

class HfTokenizer {
 public:
  // Parses tokenizer.json at `path`; throws shardlm::Error naming the file and the component it
  // cannot reproduce exactly.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // tokenizers' encode(text, add_special_tokens).ids. `text` must be valid UTF-8.
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  // tokenizers' decode(ids, skip_special_tokens); like it, ids unknown to the vocabulary are skipped.
  std::string decode(const std::vector<int>& ids, bool skip_special_tokens = false) const;

  // max id + 1 over the model vocabulary and the added tokens.
  int vocab_size() const;
  int token_to_id(std::string_view token) const;  // added tokens first, then the model; -1 if none
  bool is_special_added(std::string_view token) const;  // an added token marked "special": true
  // The bytes of the text that token `id` stands for, so that a token's place in the text it was
  // encoded from can be found (chat masks, data/prep/chat_masks.h): an added token's content; a
  // model token mapped back through the byte-level alphabet when the tokenizer is byte-level (its
  // pre-tokenizer or decoder is ByteLevel), else with U+2581 as a space and <0xNN> as byte NN.
  // Throws for an id outside the vocabulary.
  std::string token_bytes(int id) const;
  // The token the post-processor puts first (TemplateProcessing's leading SpecialToken), -1 if none.
  int template_bos_id() const;
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm::data
