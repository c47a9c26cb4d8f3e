// Fine-tuning data (`shardlm prepare --sft`): JSON-lines prompt/completion pairs, or conversations
// (SftOptions::format; a conversation's sample and mask are data/prep/chat_masks.h's, everything below
// from the rows on applies to them too) -> a token file of fixed rows plus its loss-mask sidecar
// (data/loader/loss_mask.h), so the trainer scores only the completions and never lets one sample attend to
// another. The rules:
//   - each non-blank line of the inputs (*.jsonl / *.ndjson, plain or .gz) is an object whose string
//     fields prompt_field and completion_field (default "prompt", "completion") are both present and
//     non-empty; a bad line stops prepare naming file and line (or is skipped and counted with
//     skip_bad_lines), with out_dir untouched;
//   - a sample is [BOS] + encode(prompt) + encode(completion) + [EOS]: prompt and completion are
//     encoded each on its own, without the tokenizer's own special tokens; BOS is the tokenizer's
//     bos id (none when it has none, or with add_bos false); EOS its eos id. The completion's ids and
//     the EOS count in the loss; BOS and the prompt do not (transformers' labels = -100 there);
//   - rows hold row_length = seq_len + 1 tokens (a row's inputs are its first seq_len tokens, its
//     targets the last seq_len). padded: one sample per row, then padding; packed: samples in input
//     order, each in the current row while it fits, else in a new row (next fit; a sample is never
//     split), each row ended by padding. Padding is the eos id and never counts;
//   - a sample longer than a row is refused naming its line, or with truncate cut to the row's
//     length (its EOS then lost); a sample left with no completion token after the cut is refused;
//   - the last n_val = max(1, llround(val_fraction * samples)) samples go to val.bin (+ its mask), the
//     others to train.bin; val_fraction 0 writes no validation file;
//   - with shard_tokens > 0 each split is written as train_000000.bin, ... (val_000000.bin, ...) of
//     rows_per_shard = floor(shard_tokens / row_length) whole rows each (the last one shorter), every
//     token file with its own mask; the trainer reads them as one sequence through a pattern
//     (data.train = "DIR/train_*.bin"), the same rows as one file;
//   - every file is written to a temporary and renamed only once all are written, and token files
//     or masks of an earlier prepare in out_dir that this one does not write are removed.
// Encoding runs on `threads` threads (0: every core), each with its own tokenizer; the output does
// not depend on the thread count. Memory is bounded by one batch of text (1 MiB per thread) and the
// open row, whatever the input size: samples are staged on disk (4 + 1 bytes per token, 4 per
// sample) until all are counted, then cut into rows (measured on 2 cores, GPT-2 tokenizer.json,
// packed rows of 2049: peak RSS 499 MB for 100 MB of JSONL pairs, 498 MB for 1 GB, of which the
// process takes ~480 MB on any input). A tokenizer is never trained here: fine-tuning data must be
// encoded with the tokenizer of the model it fine-tunes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/prep/documents.h"

namespace shardlm::data {

struct SftOptions {
  std::vector<std::string> inputs;  // JSON-lines files or glob patterns
  std::string tokenizer;            // .model or tokenizer.json
  std::string out_dir;
  double val_fraction = 0.05;  // in [0, 1)
  std::string prompt_field = "prompt", completion_field = "completion";
  int64_t seq_len = 0;  // rows of seq_len + 1 tokens; the training run's data.seq_len
  bool pack = false;    // false: one sample per row (padded)
  bool truncate = false;
  bool add_bos = true;
  bool skip_bad_lines = false;
  int64_t shard_tokens = 0;  // 0: one file per split; else shards of floor(shard_tokens / (seq_len + 1)) rows
  int threads = 0;           // 0: every core
  std::string eos_token;     // --eos-token: the token ending each sample ("": the tokenizer's rule)
  // Conversations (docs/chat-templates.md, data/chat/): "pairs" (prompt/completion), "messages",
  // "sharegpt", or "auto" (conversations when the first line holds "messages" or "conversations",
  // then each line's format detected; else pairs). A conversation is rendered with the tokenizer
  // folder's chat template (or chat_template, a file), encoded without the tokenizer's special
  // tokens and masked by train_on ("assistant" or "last"); no BOS or EOS is added (the template
  // writes them); strftime_now renders template_date ("YYYY-MM-DD"; empty: today).
  std::string format = "auto";
  std::string chat_template;
  std::string train_on = "assistant";
  std::string template_date;
};

struct SftResult {
  int64_t samples = 0, train_samples = 0, val_samples = 0, skipped_lines = 0, truncated = 0;
  bool conversations = false;      // the inputs were read as conversations
  std::string chat_template_name;  // the template that rendered lines without tools
  int64_t assistant_turns = 0;     // over all conversations kept
  int64_t turns_left_out = 0;      // earlier assistant turns the prefix rule left out (chat_masks.h)
  int64_t train_rows = 0, val_rows = 0;
  int64_t train_loss_tokens = 0, val_loss_tokens = 0;  // targets that count
  int64_t train_tokens = 0, val_tokens = 0;            // sample tokens (without padding)
  int vocab_size = 0, token_bits = 16;
  std::string eos;  // the eos that ends each sample: id, text and where it came from
  int64_t rows_per_shard = 0;                    // 0: not sharded
  std::string train_path, val_path;              // the file, or the shards' pattern; val_path empty without validation
  std::vector<std::string> train_files, val_files;  // token files
  std::vector<std::string> written;  // token files and masks, in commit order
  std::vector<std::string> removed;  // stale ones of an earlier prepare
};

SftResult prepare_sft(const SftOptions& options);

}  // namespace shardlm::data
