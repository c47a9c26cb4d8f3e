// `shardlm prepare`: turns text or JSON-lines files into the llm.c token files the trainer reads,
// optionally training the SentencePiece tokenizer first, or (--sft) fine-tuning pairs into rows and
// loss masks. Argument parsing and the progress line only; the work is data::prepare_corpus and
// data::prepare_sft.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "data/prep/prepare.h"
#include "data/prep/sft.h"
#include "util/error.h"

namespace shardlm::cli {

namespace {

int run_prepare_sft(const CLI::App& app, const data::PrepareOptions& opt, data::SftOptions sft, bool pad, bool no_bos) {
  if (app.count("--train-tokenizer")) {
    fail("--train-tokenizer does not apply to --sft data: fine-tuning data must be encoded with the tokenizer of ",
         "the model it fine-tunes, whose ids a newly trained one does not share; pass that model's tokenizer ",
         "(to fine-tune a model trained here from scratch, train its tokenizer with `shardlm prepare ",
         "--train-tokenizer` on the pretraining text and pass the .model it wrote)");
  }
  for (const char* flag : {"--text-unit", "--text-field"}) {
    if (app.count(flag)) fail(flag, " does not apply to --sft data (use --prompt-field and --completion-field)");
  }
  if (pad && sft.pack) fail("--pad and --pack exclude each other: pass one (--pad is the default)");
  sft.inputs = opt.inputs;
  sft.tokenizer = opt.tokenizer;
  sft.out_dir = opt.out_dir;
  sft.val_fraction = opt.val_fraction;
  sft.skip_bad_lines = opt.documents.skip_bad_lines;
  sft.add_bos = !no_bos;
  sft.shard_tokens = opt.shard_tokens;
  sft.threads = opt.threads;
  sft.eos_token = opt.eos_token;
  const auto t0 = std::chrono::steady_clock::now();
  const data::SftResult r = data::prepare_sft(sft);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("prepare --sft: %lld samples (%lld train, %lld val), %s rows of %lld tokens, vocab %d (%d-bit ids), %.1f s\n",
              static_cast<long long>(r.samples), static_cast<long long>(r.train_samples),
              static_cast<long long>(r.val_samples), sft.pack ? "packed" : "padded",
              static_cast<long long>(sft.seq_len + 1), r.vocab_size, r.token_bits, secs);
  if (r.rows_per_shard > 0) {
    std::printf("  shards of %lld rows = %lld tokens each (--shard-tokens %lld rounded down to whole rows)\n",
                static_cast<long long>(r.rows_per_shard), static_cast<long long>(r.rows_per_shard * (sft.seq_len + 1)),
                static_cast<long long>(sft.shard_tokens));
  }
  std::printf("  train: %lld rows, %lld sample tokens, %lld targets in the loss; %s in %zu file(s)\n",
              static_cast<long long>(r.train_rows), static_cast<long long>(r.train_tokens),
              static_cast<long long>(r.train_loss_tokens), r.train_path.c_str(), r.train_files.size());
  if (r.val_samples > 0)
    std::printf("  val: %lld rows, %lld sample tokens, %lld targets in the loss; %s in %zu file(s)\n",
                static_cast<long long>(r.val_rows), static_cast<long long>(r.val_tokens),
                static_cast<long long>(r.val_loss_tokens), r.val_path.c_str(), r.val_files.size());
  else
    std::printf("  no validation file (--val-fraction 0); train with data.val = \"\"\n");
  if (r.conversations) std::printf("  eos (pads rows; the chat template writes each turn's end): %s\n", r.eos.c_str());
  else std::printf("  eos ending each sample: %s\n", r.eos.c_str());
  if (r.conversations) {
    std::printf("  conversations rendered with chat template \"%s\"; %lld assistant turns, %lld left out of the loss "
                "(their rendering is not a prefix of the conversation's, see docs/chat-templates.md)\n",
                r.chat_template_name.c_str(), static_cast<long long>(r.assistant_turns),
                static_cast<long long>(r.turns_left_out));
  }
  if (r.skipped_lines > 0) std::printf("  skipped %lld bad lines (--skip-bad-lines)\n", static_cast<long long>(r.skipped_lines));
  if (r.truncated > 0) std::printf("  truncated %lld samples to the row (--truncate)\n", static_cast<long long>(r.truncated));
  for (const std::string& path : r.written) std::printf("  wrote %s\n", path.c_str());
  for (const std::string& path : r.removed) std::printf("  removed %s (an earlier prepare's)\n", path.c_str());
  if (r.rows_per_shard > 0) {
    std::printf("  train with data.seq_len = %lld and data.train = \"%s\"\n", static_cast<long long>(sft.seq_len),
                r.train_path.c_str());
  } else {
    std::printf("  train with data.seq_len = %lld\n", static_cast<long long>(sft.seq_len));
  }
  return 0;
}

}  // namespace

int run_prepare(int argc, char** argv) {
  data::PrepareOptions opt;
  std::string unit = "line";
  CLI::App app{
      "Encode text into llm.c token files (train.bin, val.bin, or shards of them).\n"
      "Inputs are UTF-8 text (a document per non-empty line, per blank-line-separated block or per\n"
      "file: --text-unit) or JSON lines (*.jsonl, *.ndjson: the --text-field string of each object),\n"
      "plain or gzipped (.gz), given as files or glob patterns. Each document is encoded with the\n"
      "tokenizer's own special tokens (a tokenizer.json's post-processor) and ended by its eos id;\n"
      "the last --val-fraction of the documents go to validation. Ids are written 16-bit (llm.c\n"
      "version 1) for vocabularies of at most 65536 ids, else 32-bit (version 7). Bad input stops\n"
      "prepare naming the file and line before anything is written (or --skip-bad-lines).",
      "shardlm prepare"};
  app.add_option("--input", opt.inputs, "text or JSON-lines file or glob pattern (repeatable; read in the order given)")
      ->required();
  app.add_option("--tokenizer", opt.tokenizer,
                 "SentencePiece .model or Hugging Face tokenizer.json or its folder (a .model is written if "
                 "--train-tokenizer; conversations need the folder, with tokenizer_config.json)")
      ->required();
  app.add_option("--out-dir", opt.out_dir, "folder for the token files")->required();
  app.add_option("--val-fraction", opt.val_fraction, "share of documents (from the end) held out; 0: none")
      ->capture_default_str();
  app.add_option("--train-tokenizer", opt.train_vocab_size,
                 "train a BPE tokenizer with this vocabulary size at --tokenizer first");
  app.add_option("--text-unit", unit, "documents of a text file: line, block or file")->capture_default_str();
  app.add_option("--text-field", opt.documents.text_field, "the JSON-lines field holding the text")
      ->capture_default_str();
  app.add_flag("--skip-bad-lines", opt.documents.skip_bad_lines,
               "skip (and count) lines that are not valid JSON, lack the field, are empty or not UTF-8");
  app.add_option("--shard-tokens", opt.shard_tokens,
                 "write train_000000.bin, ... of this many tokens each (0: one file per split); "
                 "train with data.train = \"DIR/train_*.bin\"")
      ->capture_default_str();
  app.add_option("--threads", opt.threads, "encoding threads (0: every core)")->capture_default_str();
  app.add_option("--eos-token", opt.eos_token,
                 "a tokenizer.json's token that ends each document (default: tokenizer_config.json's eos_token, "
                 "generation_config.json's or config.json's eos_token_id beside it, else the first of </s>, "
                 "<|end_of_text|>, <|endoftext|>, <eos>, <｜end▁of▁sentence｜> that is a special added token)");
  // Fine-tuning data (data/prep/sft.h): prompt/completion pairs -> rows of seq_len + 1 tokens + loss masks.
  data::SftOptions sft;
  bool sft_mode = false, pad = false, no_bos = false;
  app.add_flag("--sft", sft_mode,
               "fine-tuning data: JSON-lines prompt/completion pairs -> rows of --seq-len + 1 tokens and a loss mask "
               "(train.bin.mask) that scores only the completions and the EOS");
  app.add_option("--prompt-field", sft.prompt_field, "--sft: the JSON field holding the prompt")->capture_default_str();
  app.add_option("--completion-field", sft.completion_field, "--sft: the JSON field holding the completion")
      ->capture_default_str();
  app.add_option("--seq-len", sft.seq_len, "--sft: the training run's data.seq_len (rows hold seq_len + 1 tokens)");
  app.add_flag("--pack", sft.pack, "--sft: pack whole samples into each row (attention and positions per sample)");
  app.add_flag("--pad", pad, "--sft: one sample per row, padded (the default)");
  app.add_flag("--truncate", sft.truncate, "--sft: cut a sample longer than a row instead of refusing it");
  app.add_flag("--no-bos", no_bos, "--sft: no BOS before the prompt (default: the tokenizer's BOS when it has one)");
  // Conversations (data/prep/conversation.h, data/prep/chat_masks.h, docs/chat-templates.md).
  app.add_option("--format", sft.format,
                 "--sft: auto, pairs (prompt/completion), messages (OpenAI/TRL) or sharegpt (conversations); auto "
                 "reads conversations when the first line holds \"messages\" or \"conversations\"")
      ->capture_default_str();
  app.add_option("--chat-template", sft.chat_template,
                 "--sft conversations: a Jinja file that replaces the tokenizer folder's chat template");
  app.add_option("--train-on", sft.train_on,
                 "--sft conversations: assistant (every assistant turn) or last (the final one) counts in the loss")
      ->capture_default_str();
  app.add_option("--template-date", sft.template_date,
                 "--sft conversations: the date (YYYY-MM-DD) the template's strftime_now renders (default: today)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    fail(e.what(), "; run `shardlm prepare --help` for the options");
  }
  if (sft_mode) return run_prepare_sft(app, opt, sft, pad, no_bos);
  if (app.count("--prompt-field") || app.count("--completion-field") || app.count("--seq-len") || sft.pack || pad ||
      sft.truncate || no_bos || app.count("--format") || app.count("--chat-template") || app.count("--train-on") ||
      app.count("--template-date")) {
    fail("--prompt-field, --completion-field, --seq-len, --pack, --pad, --truncate, --no-bos, --format, ",
         "--chat-template, --train-on and --template-date describe fine-tuning data; add --sft");
  }
  opt.documents.unit = data::parse_text_unit(unit);

  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  double last = -1;
  opt.progress = [&](int64_t docs, int64_t tokens, int64_t bytes) {
    const double s = seconds();
    if (!tty || s - last < 0.5) return;
    last = s;
    std::fprintf(stderr, "\rprepare: %.1f MB read, %lld documents, %lld tokens, %.0f tokens/s   ", bytes / 1e6,
                 static_cast<long long>(docs), static_cast<long long>(tokens), tokens / std::max(s, 1e-9));
    std::fflush(stderr);
  };
  const data::PrepareResult r = data::prepare_corpus(opt);
  if (tty && last >= 0) std::fprintf(stderr, "\n");
  const double secs = seconds();
  std::printf("prepare: %lld documents (%lld train, %lld val), vocab %d (%d-bit ids), %.1f s, %.0f tokens/s\n",
              static_cast<long long>(r.documents), static_cast<long long>(r.train_documents),
              static_cast<long long>(r.val_documents), r.vocab_size, r.token_bits, secs,
              (r.train_tokens + r.val_tokens) / std::max(secs, 1e-9));
  std::printf("  eos ending each document: %s\n", r.eos.c_str());
  if (r.skipped_lines > 0 || r.skipped_files > 0) {
    std::printf("  skipped %lld bad lines and %lld files without a document (--skip-bad-lines)\n",
                static_cast<long long>(r.skipped_lines), static_cast<long long>(r.skipped_files));
  }
  std::printf("  %s: %lld tokens in %zu file(s)\n", r.train_path.c_str(), static_cast<long long>(r.train_tokens),
              r.train_files.size());
  if (r.val_path.empty()) {
    std::printf("  no validation file (--val-fraction 0); train with data.val = \"\"\n");
  } else {
    std::printf("  %s: %lld tokens in %zu file(s)\n", r.val_path.c_str(), static_cast<long long>(r.val_tokens),
                r.val_files.size());
  }
  for (const std::string& path : r.removed) std::printf("  removed %s (an earlier prepare's)\n", path.c_str());
  return 0;
}

}  // namespace shardlm::cli
