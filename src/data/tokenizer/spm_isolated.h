// SentencePiece, loaded in isolation. Debian's libsentencepiece.so.0 carries its own copy of
// protobuf 3.14 and exports its symbols; libtorch loads the system libprotobuf.so.32 (3.21). With
// both in the process's global symbol scope, libprotobuf's start-up code binds to sentencepiece's
// copies and the program segfaults before main (the same crash as pytorch-lightning#11663). So
// shardlm never links sentencepiece: it dlopen()s it RTLD_LOCAL | RTLD_DEEPBIND, which keeps it out
// of the global scope and binds sentencepiece to its own protobuf, and calls the few functions it
// needs through dlsym. Internal to the data layer; Tokenizer is the interface. (Training runs the
// spm_train program instead, see train_tokenizer in tokenizer.h.)
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::data::spm {

// One sentencepiece::SentencePieceProcessor. Methods return an empty string on success and
// sentencepiece's error message otherwise; the caller adds the context.
class Processor {
 public:
  Processor();  // throws shardlm::Error if the library cannot be loaded
  ~Processor();
  Processor(const Processor&) = delete;
  Processor& operator=(const Processor&) = delete;

  std::string load(const std::string& model_path);
  std::string encode(std::string_view text, std::vector<int>* ids) const;
  std::string decode(const std::vector<int>& ids, std::string* text) const;
  int piece_size() const;
  int bos_id() const;
  int eos_id() const;

 private:
  void* self_;  // the processor object, allocated here, constructed by the library
};

}  // namespace shardlm::data::spm
