// Text <-> token ids through a SentencePiece model (the tokenizer family Llama uses). A pimpl keeps
// sentencepiece's headers (and their absl shims) out of every file that only needs ids.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace shardlm::data {

class Tokenizer {
 public:
  // Loads a SentencePiece .model file; throws shardlm::Error if it is missing or not a model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int> encode(const std::string& text) const;
  std::string decode(const std::vector<int>& ids) const;

  int vocab_size() const;
  int bos_id() const;  // -1 when the model defines none
  int eos_id() const;  // -1 when the model defines none
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// Trains a SentencePiece model on `documents` (one training sentence each) with the settings
// shardlm uses everywhere: byte-level BPE (byte fallback, every character covered), digits split,
// ids unk=0 bos=1 eos=2, no pad, one thread and a fixed seed so reruns agree. Runs the spm_train
// program (in-process training would need sentencepiece's global logging, see spm_isolated.h);
// scripts/make_corpus.sh runs the same command, so the same documents give the same model bytes.
// Writes model_path (must end in ".model") and the matching ".vocab" next to it.
void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_path,
                     int vocab_size);

}  // namespace shardlm::data
