// Text -> llm.c token files, the work behind `shardlm prepare`. It lives in the data layer (not in
// the CLI) so tests can run it, and scripts/make_corpus.sh reimplements the same rule in Python:
//   - a document is one input line that holds a non-whitespace character (a trailing '\r' is
//     dropped); files are read in the order given, lines in file order;
//   - each document becomes encode(line) followed by the tokenizer's eos id (no bos);
//   - the last n_val = max(1, llround(val_fraction * documents)) documents go to val.bin, the others
//     to train.bin, both in out_dir;
//   - a tokenizer trained here (train_vocab_size > 0) sees only the train.bin documents;
//   - ids are written 16-bit (llm.c version 1) for vocabularies of at most 65536 pieces, else
//     32-bit (llm.c version 7).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::data {

class Tokenizer;

struct PrepareOptions {
  std::vector<std::string> inputs;  // UTF-8 text files
  std::string tokenizer;            // .model path; written first when train_vocab_size > 0
  std::string out_dir;
  double val_fraction = 0.05;  // in (0, 1)
  int train_vocab_size = 0;    // 0: use the existing tokenizer; else train one on train.bin's documents
};

struct PrepareResult {
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int vocab_size = 0;
  int token_bits = 16;  // 16 or 32 per id in both files
  std::string train_path, val_path;
};

// Documents of the given files, by the rule above.
std::vector<std::string> read_documents(const std::vector<std::string>& paths);

// Tokens of documents [begin, end): each document's ids then eos.
std::vector<uint32_t> encode_documents(const Tokenizer& tokenizer,
                                       const std::vector<std::string>& documents, size_t begin,
                                       size_t end);

PrepareResult prepare_corpus(const PrepareOptions& options);

}  // namespace shardlm::data
