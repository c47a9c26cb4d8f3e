// Text -> llm.c token files, the work behind `shardlm prepare`. It lives in the data layer (not in
// the CLI) so tests can run it, and scripts/make_corpus.sh reimplements the default rule in Python:
//   - documents come from the inputs as data/prep/documents.h defines (text lines by default; blocks,
//     whole files, JSON lines, .gz, globs), in input order;
//   - each document becomes tokenizer.encode(document) — with the special tokens the tokenizer
//     itself adds (a tokenizer.json's post-processor, e.g. Llama 3's BOS; a SentencePiece .model
//     adds none) — followed by the tokenizer's eos id, unless the encoding already ends with it;
//   - the last n_val = max(1, llround(val_fraction * documents)) documents go to validation, the
//     others to training; val_fraction 0 holds nothing out (and writes no validation file);
//   - a tokenizer trained here (train_vocab_size > 0) sees only the training documents;
//   - ids are written 16-bit (llm.c version 1) for vocabularies of at most 65536 ids, else 32-bit
//     (llm.c version 7);
//   - out_dir gets train.bin and val.bin, or with shard_tokens > 0 train_000000.bin, ... and
//     val_000000.bin, ... of shard_tokens tokens each (the last one shorter), which the trainer
//     reads as one sequence through a pattern (data.train = "DIR/train_*.bin"); token files of an
//     earlier prepare in out_dir that this one does not write again are removed, so such a pattern
//     never picks up a stale shard (and a loss mask of an earlier `prepare --sft` is removed too, so
//     these files are never read as fine-tuning data);
//   - every file is written atomically, and only once every document has been read and encoded:
//     bad input leaves out_dir as it was.
// Encoding runs on `threads` threads (0: every core), each with its own tokenizer; the order of
// the output is the order of the input whatever the thread count.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "data/prep/documents.h"

namespace shardlm::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or glob patterns
  std::string tokenizer;            // .model or tokenizer.json; a .model is written first when train_vocab_size > 0
  std::string out_dir;
  double val_fraction = 0.05;  // in [0, 1)
  int train_vocab_size = 0;    // 0: use the existing tokenizer; else train one on the training documents
  DocumentOptions documents;   // how inputs become documents
  int64_t shard_tokens = 0;    // 0: one train.bin (and val.bin); else shards of this many tokens
  int threads = 0;             // 0: every core
  std::string eos_token;       // --eos-token: the token ending each document ("": the tokenizer's rule)
  // Called now and then while encoding (for a progress line): documents, tokens, input bytes read.
  std::function<void(int64_t, int64_t, int64_t)> progress;
};

struct PrepareResult {
  int64_t documents = 0, train_documents = 0, val_documents = 0, skipped_lines = 0, skipped_files = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int vocab_size = 0;
  int token_bits = 16;  // 16 or 32 per id in every file
  std::string eos;      // the eos that ends each document: id, text and where it came from
  std::string train_path, val_path;  // the file, or the shards' pattern; val_path empty without validation
  std::vector<std::string> train_files, val_files;
  std::vector<std::string> removed;  // stale token files of an earlier prepare
};

// Every document of the given files, by documents.h's rules (Line unit unless given).
std::vector<std::string> read_documents(const std::vector<std::string>& paths, const DocumentOptions& options = {});

PrepareResult prepare_corpus(const PrepareOptions& options);

// Whether a file name is one prepare writes: train.bin, val.bin, train_NNNNNN.bin, val_NNNNNN.bin,
// and the loss masks beside them (<name>.mask, prepare --sft).
bool is_prepare_output(const std::string& name);
// Removes the files of out_dir that is_prepare_output names and `written` (paths) does not hold, so
// a glob never picks up a stale shard and no mask outlives its token file; returns them, sorted.
std::vector<std::string> remove_stale_outputs(const std::string& out_dir, const std::set<std::string>& written);

}  // namespace shardlm::data
