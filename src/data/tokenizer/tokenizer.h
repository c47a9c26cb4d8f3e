// Text <-> token ids through a SentencePiece .model or a Hugging Face tokenizer.json (the second
// through data/tokenizer/hf_tokenizer.h, with the ids of Python's `tokenizers`). A pimpl keeps sentencepiece's
// headers (and their absl shims) and the tokenizer.json machinery out of every file that only
// needs ids.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace shardlm::data {

// The names of a document's end, in the order tried when no file beside a tokenizer.json names the
// eos: Llama 2 / Mistral, Llama 3, GPT-2 / Qwen2 / Phi-3, Gemma, DeepSeek. Chat turn ends
// (<|im_end|>, <|eot_id|>, <|end|>) are not in it: they end a turn, not a document.
inline constexpr const char* kConventionalEosNames[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>",
                                                        "<｜end▁of▁sentence｜>"};

class Tokenizer {
 public:
  // Loads `model_path`: a path ending in ".json" (or a folder holding tokenizer.json) is a
  // Hugging Face tokenizer.json, anything else a SentencePiece .model. Throws shardlm::Error if it
  // is missing, not a tokenizer, or (tokenizer.json) uses a component shardlm does not implement.
  //
  // Special ids of a tokenizer.json:
  //   bos_id: the first id its post-processor puts before the text (TemplateProcessing's leading
  //           SpecialToken, e.g. Llama's <s>, Llama 3's <|begin_of_text|>), else -1 (GPT-2, Qwen2:
  //           encode adds nothing, so neither does anything built on bos_id);
  //   eos_id: the token that ends each document, from the first of these beside the file that
  //           names one: tokenizer_config.json's `eos_token` (a string or {"content": ...});
  //           generation_config.json's `eos_token_id`, then config.json's (an id, or the first of
  //           a list); a name there that is not a token of the file is an error. Without them, the
  //           first of kConventionalEosNames that is a *special* added token of the file (a plain
  //           vocabulary entry of that spelling is not an eos: Qwen2's "</s>" is BPE id 128247,
  //           Phi-3's is not special); else -1. `eos_token` (prepare's --eos-token) overrides all.
  explicit Tokenizer(const std::string& model_path, const std::string& eos_token = "");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text`; for a tokenizer.json with the special tokens its post-processor adds
  // (tokenizers' encode(text, add_special_tokens=True)). A .model adds none either way.
  std::vector<int> encode(const std::string& text) const { return encode(text, true); }
  std::vector<int> encode(const std::string& text, bool add_special_tokens) const;
  // Text of `ids` (every id must be below vocab_size()); skip_special_tokens drops a
  // tokenizer.json's special added tokens, as tokenizers' decode does (a .model ignores it).
  std::string decode(const std::vector<int>& ids) const { return decode(ids, false); }
  std::string decode(const std::vector<int>& ids, bool skip_special_tokens) const;

  // For a tokenizer.json the whole id space: max id + 1 over the model vocabulary and the added
  // tokens (tokenizers' get_vocab_size(with_added_tokens=True) when the ids have no gaps).
  int vocab_size() const;
  // A tokenizer.json's HfTokenizer::token_bytes(id); a .model is refused (chat masks need it).
  std::string token_bytes(int id) const;
  bool is_hf_json() const;
  int bos_id() const;  // -1 when the model defines none
  int eos_id() const;  // -1 when the model defines none
  const std::string& eos_source() const;  // where eos_id came from ("eos_token of tokenizer_config.json", ...)
  std::string eos_description() const;    // id 151643 "<|endoftext|>" (where it came from); "none"
  std::string no_eos_error() const;       // why there is no eos, naming --eos-token
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// The file a tokenizer path names (a folder's tokenizer.json, else the path itself) and the name it
// has in a model folder, where `generate` looks for it: "tokenizer.json" or "tokenizer.model".
struct TokenizerFile {
  std::string path, name;
};
TokenizerFile tokenizer_file(const std::string& path);

// The files beside a tokenizer.json that make it chat in transformers as it did (docs/chat-templates.md),
// as paths relative to its folder, those present only: tokenizer_config.json (special tokens, chat
// template), special_tokens_map.json, chat_template.jinja, additional_chat_templates/*.jinja and
// generation_config.json (end-of-turn ids). None for a SentencePiece .model.
std::vector<std::string> tokenizer_companion_files(const std::string& path);

// Trains a SentencePiece model on `documents` (one training sentence each) with the settings
// shardlm uses everywhere: byte-level BPE (byte fallback, every character covered), digits split,
// ids unk=0 bos=1 eos=2, no pad, one thread and a fixed seed so reruns agree. Runs the spm_train
// program (in-process training would need sentencepiece's global logging, see spm_isolated.h);
// scripts/make_corpus.sh runs the same command, so the same documents give the same model bytes.
// Writes model_path (must end in ".model") and the matching ".vocab" next to it.
void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_path,
                     int vocab_size);

}  // namespace shardlm::data
