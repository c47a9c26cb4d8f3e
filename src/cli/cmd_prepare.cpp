// `shardlm prepare`: turns text files into the llm.c token files the trainer reads, optionally
// training the SentencePiece tokenizer first. Argument parsing only; the work is data::prepare_corpus.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "data/prepare.h"
#include "util/error.h"

namespace shardlm::cli {

int run_prepare(int argc, char** argv) {
  data::PrepareOptions opt;
  CLI::App app{
      "Encode text into llm.c token files (train.bin, val.bin).\n"
      "Each non-empty input line is one document; documents are encoded and separated by the\n"
      "tokenizer's eos id; the last --val-fraction of the documents go to val.bin. Ids are written\n"
      "16-bit (llm.c version 1) for vocabularies of at most 65536 pieces, else 32-bit (version 7).",
      "shardlm prepare"};
  app.add_option("--input", opt.inputs, "UTF-8 text file (repeatable; read in the order given)")
      ->required();
  app.add_option("--tokenizer", opt.tokenizer, "SentencePiece .model file (written if --train-tokenizer)")
      ->required();
  app.add_option("--out-dir", opt.out_dir, "folder for train.bin and val.bin")->required();
  app.add_option("--val-fraction", opt.val_fraction, "share of documents (from the end) held out")
      ->capture_default_str();
  app.add_option("--train-tokenizer", opt.train_vocab_size,
                 "train a BPE tokenizer with this vocabulary size at --tokenizer first");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    fail(e.what(), "; run `shardlm prepare --help` for the options");
  }

  const auto t0 = std::chrono::steady_clock::now();
  const data::PrepareResult r = data::prepare_corpus(opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("prepare: %lld documents (%lld train, %lld val), vocab %d (%d-bit ids), %.1f s\n",
              static_cast<long long>(r.documents), static_cast<long long>(r.train_documents),
              static_cast<long long>(r.val_documents), r.vocab_size, r.token_bits, secs);
  std::printf("  %s: %lld tokens\n", r.train_path.c_str(), static_cast<long long>(r.train_tokens));
  std::printf("  %s: %lld tokens\n", r.val_path.c_str(), static_cast<long long>(r.val_tokens));
  return 0;
}

}  // namespace shardlm::cli
