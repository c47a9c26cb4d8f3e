// `shardlm generate --model DIR --prompt TEXT`: samples a continuation from a trained model, so a
// run can be judged by reading what it writes, not only by its loss. `--messages FILE` or `--chat
// TEXT` instead render a conversation with the model's chat template and add_generation_prompt
// (docs/chat-templates.md) and stop at generation_config.json's eos_token_id (an int or a list).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "data/prep/chat_masks.h"
#include "data/prep/conversation.h"
#include "data/tokenizer/chat_template.h"
#include "data/tokenizer/jinja/jinja.h"
#include "data/tokenizer/tokenizer.h"
#include "io/hf_weights.h"
#include "model/llama.h"
#include "train/lora_config.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/threads.h"

namespace shardlm::cli {

int run_generate(int argc, char** argv) {
  CLI::App app{"Sample text from a trained model", "shardlm generate"};
  std::string model_dir, tokenizer_path, prompt, messages_file, chat_text, chat_template, template_date;
  int max_new_tokens = 64, top_k = 40, samples = 1;
  double temperature = 0.8;
  uint64_t seed = 0;
  app.add_option("--model", model_dir, "model directory (a run's out_dir or an exported HF directory)")->required();
  std::string adapter_dir;
  app.add_option("--adapter", adapter_dir, "a LoRA adapter directory (PEFT's adapter_model.safetensors + "
                 "adapter_config.json, e.g. a LoRA run's out_dir) applied to --model");
  auto* prompt_opt = app.add_option("--prompt", prompt, "text to continue");
  auto* messages_opt = app.add_option("--messages", messages_file,
                                      "JSON file of a conversation ({\"messages\": [...]} or the list) to answer, "
                                      "rendered with the model's chat template");
  auto* chat_opt = app.add_option("--chat", chat_text, "one user turn to answer, rendered with the chat template");
  prompt_opt->excludes(messages_opt)->excludes(chat_opt);
  messages_opt->excludes(chat_opt);
  app.add_option("--chat-template", chat_template, "with --messages/--chat: a Jinja file replacing the model's template");
  app.add_option("--template-date", template_date, "with --messages/--chat: the date strftime_now renders (YYYY-MM-DD)");
  app.add_option("--tokenizer", tokenizer_path, "SentencePiece .model or Hugging Face tokenizer.json "
                 "(default: MODEL/tokenizer.json if present, else MODEL/tokenizer.model)");
  app.add_option("--max-new-tokens", max_new_tokens, "tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--temperature", temperature, "softmax temperature; 0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", top_k, "sample among the k most likely tokens; 0 = all")->check(CLI::NonNegativeNumber);
  app.add_option("--samples", samples, "number of continuations")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "sampling seed");
  bool print_ids = false;
  app.add_flag("--print-ids", print_ids, "also print the generated token ids (\"ids: [...]\")");
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
  if (prompt.empty() && messages_file.empty() && chat_text.empty()) fail("pass --prompt TEXT, --messages FILE or --chat TEXT");
  util::configure_threads(0);
  data::Tokenizer tok(tokenizer_path);
  std::vector<int> prompt_ids, stop_ids;
  if (!messages_file.empty() || !chat_text.empty()) {
    if (!template_date.empty()) data::jinja::set_template_date(template_date);
    const data::chat::ChatTemplates templates(data::chat::tokenizer_folder(tokenizer_path), chat_template);
    nlohmann::ordered_json line;
    if (!chat_text.empty()) {
      line["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", chat_text}}});
    } else {
      std::ifstream in(messages_file);
      if (!in) fail("cannot read --messages ", messages_file);
      std::stringstream text;
      text << in.rdbuf();
      line = nlohmann::ordered_json::parse(text.str(), nullptr, false);
      if (line.is_array()) line = nlohmann::ordered_json{{"messages", line}};
    }
    data::chat::Conversation c;
    try {
      c = data::chat::conversation_from_json(line, data::chat::ChatFormat::Auto, /*require_assistant=*/false);
    } catch (const data::chat::ConversationError& e) {
      fail("--messages ", messages_file.empty() ? "(from --chat)" : messages_file, ": the conversation ", e.what());
    }
    prompt = data::chat::render_conversation(templates, c, c.messages.size(), /*add_generation_prompt=*/true);
    prompt_ids = tok.encode(prompt, /*add_special_tokens=*/false);  // BOS only where the template writes it
    stop_ids = templates.generation_eos_ids();
  } else {
    prompt_ids = tok.encode(prompt);
    // A tokenizer.json's encode already starts with its bos (its post-processor adds it).
    if (tok.bos_id() >= 0 && (prompt_ids.empty() || prompt_ids.front() != tok.bos_id())) {
      prompt_ids.insert(prompt_ids.begin(), tok.bos_id());
    }
  }
  const auto cfg = model::read_hf_config(model_dir + "/config.json");
  if (tok.vocab_size() > cfg.vocab_size)
    fail("tokenizer has ", tok.vocab_size(), " pieces but the model's vocab_size is ", cfg.vocab_size);
  model::Llama llama(cfg, 0);
  std::string weights;
  const auto tensors = io::load_hf_weights(model_dir, &weights);
  llama.load(tensors, weights);
  if (!adapter_dir.empty()) {  // docs/lora.md
    train::LoraConfig lora;
    lora.enabled = true;
    lora.init_from = adapter_dir;
    train::apply_lora(llama, lora, 0);
  }

  auto gen = at::detail::createCPUGenerator(seed);
  at::NoGradGuard no_grad;
  for (int s = 0; s < samples; ++s) {
    std::vector<int> ids = prompt_ids;
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
      // The tokenizer's end of sequence, or any of config.json's eos_token_id (an id or a list), or of a
      // chat's generation_config.json (its end-of-turn ids).
      if (next == tok.eos_id() || std::count(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) > 0 ||
          std::count(stop_ids.begin(), stop_ids.end(), next) > 0) {
        break;
      }
      ids.push_back(next);
    }
    std::vector<int> continuation(ids.begin() + prompt_len, ids.end());
    if (samples > 1) std::printf("--- sample %d\n", s + 1);
    if (print_ids) {
      std::string list;
      for (int id : continuation) list += (list.empty() ? "" : ", ") + std::to_string(id);
      std::printf("ids: [%s]\n", list.c_str());
    }
    if (stop_ids.empty() && messages_file.empty() && chat_text.empty()) {
      std::printf("%s%s\n", prompt.c_str(), (" " + tok.decode(continuation)).c_str());
    } else {
      std::printf("%s\n", tok.decode(continuation).c_str());  // a chat: the assistant's reply only
    }
  }
  return 0;
}

}  // namespace shardlm::cli
