// `shardlm generate --model DIR --prompt TEXT`: samples a continuation from a trained model, so a
// run can be judged by reading what it writes, not only by its loss.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "io/hf_weights.h"
#include "model/llama.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/threads.h"

namespace shardlm::cli {

int run_generate(int argc, char** argv) {
  CLI::App app{"Sample text from a trained model", "shardlm generate"};
  std::string model_dir, tokenizer_path, prompt;
  int max_new_tokens = 64, top_k = 40, samples = 1;
  double temperature = 0.8;
  uint64_t seed = 0;
  app.add_option("--model", model_dir, "model directory (a run's out_dir or an exported HF directory)")->required();
  app.add_option("--prompt", prompt, "text to continue")->required();
  app.add_option("--tokenizer", tokenizer_path, "SentencePiece .model or Hugging Face tokenizer.json "
                 "(default: MODEL/tokenizer.json if present, else MODEL/tokenizer.model)");
  app.add_option("--max-new-tokens", max_new_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--temperature", temperature, "softmax temperature; 0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", top_k, "sample among the k most likely tokens; 0 = all")->check(CLI::NonNegativeNumber);
  app.add_option("--samples", samples, "number of continuations")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "sampling seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (tokenizer_path.empty()) {
    tokenizer_path = std::filesystem::exists(model_dir + "/tokenizer.json") ? model_dir + "/tokenizer.json"
                                                                            : model_dir + "/tokenizer.model";
  }
  if (!std::filesystem::exists(tokenizer_path))
    fail("no tokenizer at '", tokenizer_path, "'; pass --tokenizer data/brown/tokenizer.model (or the model the data "
         "was prepared with)");
  util::configure_threads(0);
  data::Tokenizer tok(tokenizer_path);
  const auto cfg = model::read_hf_config(model_dir + "/config.json");
  if (tok.vocab_size() > cfg.vocab_size)
    fail("tokenizer has ", tok.vocab_size(), " pieces but the model's vocab_size is ", cfg.vocab_size);
  model::Llama llama(cfg, 0);
  std::string weights;
  const auto tensors = io::load_hf_weights(model_dir, &weights);
  llama.load(tensors, weights);

  auto gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  for (int s = 0; s < samples; ++s) {
    std::vector<int> ids = tok.encode(prompt);
    // A tokenizer.json's encode already starts with its bos (its post-processor adds it).
    if (tok.bos_id() >= 0 && (ids.empty() || ids.front() != tok.bos_id())) ids.insert(ids.begin(), tok.bos_id());
    const size_t prompt_len = ids.size();
    for (int i = 0; i < max_new_tokens; ++i) {
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - cfg.max_position_embeddings);
      std::vector<int64_t> window(ids.begin() + start, ids.end());
      auto input = at::tensor(window, at::kLong).unsqueeze(0);
      auto logits = llama.forward(input).select(1, input.size(1) - 1).squeeze(0);
      int next;
      if (temperature == 0) {
        next = static_cast<int>(logits.argmax().item<int64_t>());
      } else {
        logits = logits / temperature;
        if (top_k > 0 && top_k < logits.size(0)) {
          const auto kth = std::get<0>(logits.topk(top_k)).min();
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
        }
        next = static_cast<int>(at::multinomial(at::softmax(logits, -1), 1, false, gen).item<int64_t>());
      }
      // The tokenizer's end of sequence, or any of config.json's eos_token_id (an id or a list).
      if (next == tok.eos_id() || std::count(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) > 0) break;
      ids.push_back(next);
    }
    std::vector<int> continuation(ids.begin() + prompt_len, ids.end());
    std::printf("%s%s%s\n", samples > 1 ? ("--- sample " + std::to_string(s + 1) + "\n").c_str() : "", prompt.c_str(),
                (" " + tok.decode(continuation)).c_str());
  }
  return 0;
}

}  // namespace shardlm::cli
