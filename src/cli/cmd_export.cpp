// `shardlm export --run DIR --out DIR [--dtype f32|bf16|f16]`: writes a Hugging Face model
// directory (config.json + model.safetensors, loadable by transformers' LlamaForCausalLM) from a
// training run's output directory or any shardlm/HF model directory.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/export_lora.h"
#include "data/tokenizer/tokenizer.h"
#include "io/hf_weights.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "plan/planner.h"
#include "train/checkpoint.h"
#include "train/checkpoint_export.h"
#include "util/error.h"
#include "util/process_memory.h"

namespace shardlm::cli {
namespace {

// Export never destroys its source, nor an earlier export: --out must not be the run directory, and
// must not hold a file the export writes. Checked before anything is read or written.
void refuse_to_overwrite(const std::string& run_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out_dir, ec) && fs::exists(run_dir, ec) && fs::equivalent(run_dir, out_dir, ec))
    fail("--out '", out_dir, "' is the run directory itself: the export would overwrite the run's own config.json and "
         "model.safetensors (its fp32 weights). Choose another directory, e.g. --out ", (fs::path(run_dir) / "hf").string());
  if (!fs::is_directory(out_dir, ec)) return;
  std::vector<std::string> clash;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("model-", 0) == 0 && name.size() > 12 && name.substr(name.size() - 12) == ".safetensors";
    if (name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
        name == "tokenizer.model" || name == "tokenizer.json" || name == "tokenizer_config.json" ||
        name == "chat_template.jinja" || name == "generation_config.json" || shard)
      clash.push_back(name);
  }
  if (clash.empty()) return;
  std::sort(clash.begin(), clash.end());
  std::string names;
  for (const auto& n : clash) names += (names.empty() ? "" : ", ") + n;
  fail("--out '", out_dir, "' already holds ", names, ", which the export would overwrite. Choose a new or empty "
       "directory, or remove ", clash.size() > 1 ? "them" : "it", " first");
}

// The run's tokenizer (SentencePiece tokenizer.model or HF tokenizer.json) goes with the weights, a
// tokenizer.json with its tokenizer_config.json (special tokens, chat template), chat template files and
// generation_config.json, so the exported model chats in transformers as it did before fine-tuning.
void copy_tokenizer(const std::string& run_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"tokenizer.model", "tokenizer.json"})
    if (fs::exists(run_dir + "/" + name)) fs::copy_file(run_dir + "/" + name, out_dir + "/" + name);
  if (!fs::exists(run_dir + "/tokenizer.json")) return;
  for (const std::string& name : data::tokenizer_companion_files(run_dir + "/tokenizer.json")) {
    fs::create_directories((fs::path(out_dir) / name).parent_path());
    fs::copy_file(fs::path(run_dir) / name, fs::path(out_dir) / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

int run_export(int argc, char** argv) {
  CLI::App app{"Export a trained model as a Hugging Face directory", "shardlm export"};
  std::string run_dir, out_dir, dtype = "f32";
  app.add_option("--run", run_dir, "training run directory (out_dir) holding config.json + model.safetensors")->required();
  app.add_option("--out", out_dir, "directory to write")->required();
  app.add_option("--dtype", dtype, "stored dtype")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  std::string source = "auto", max_shard = "0";
  app.add_option("--source", source,
                 "model: DIR/model.safetensors; checkpoint: the newest sharded checkpoint in DIR/checkpoints, streamed "
                 "tensor by tensor; auto: model.safetensors when present")
      ->check(CLI::IsMember({"auto", "model", "checkpoint"}));
  app.add_option("--max-shard-size", max_shard,
                 "with --source checkpoint: split into HF's sharded files of at most this size (e.g. 2GB); 0: one file");
  bool merge = false;
  std::string base;
  app.add_flag("--merge", merge, "a LoRA run: write the base with the adapter merged in (an HF model directory)");
  app.add_option("--base", base, "with --merge: the base model directory (default: the adapter's base_model_name_or_path)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  namespace fs = std::filesystem;
  refuse_to_overwrite(run_dir, out_dir);
  const auto target_dtype = dtype == "bf16" ? at::kBFloat16 : dtype == "f16" ? at::kHalf : at::kFloat;
  if (is_adapter_dir(run_dir)) {  // a LoRA run (docs/lora.md)
    const std::string merged_base = export_adapter(run_dir, out_dir, target_dtype, merge, base);
    copy_tokenizer(run_dir, out_dir);
    // A merged model is the base's model: without a tokenizer in the run, the base folder's goes with it
    // (tokenizer.json with its config, chat template and generation_config.json), as transformers needs.
    if (!merged_base.empty() && !fs::exists(out_dir + "/tokenizer.json") && !fs::exists(out_dir + "/tokenizer.model"))
      copy_tokenizer(merged_base, out_dir);
    return 0;
  }
  if (merge) fail("--merge: '", run_dir, "' holds no LoRA adapter (adapter_model.safetensors)");
  if (source == "checkpoint" || (source == "auto" && !fs::exists(run_dir + "/model.safetensors") &&
                                 fs::exists(train::checkpoints_root(run_dir)))) {
    const auto r = train::export_checkpoint(run_dir, out_dir, target_dtype, static_cast<int64_t>(plan::parse_bytes(max_shard)));
    copy_tokenizer(run_dir, out_dir);
    std::printf("exported %lld tensors (%s, %.1f MB in %lld file(s)) from %s to %s; peak RSS %.1f MB\n",
                static_cast<long long>(r.tensors), dtype.c_str(), r.bytes / 1e6, static_cast<long long>(r.files),
                r.checkpoint.c_str(), out_dir.c_str(), peak_resident_bytes() / 1e6);
    return 0;
  }
  if (max_shard != "0") fail("--max-shard-size needs --source checkpoint");
  const auto cfg = model::read_hf_config(run_dir + "/config.json");
  // Loading into the model validates names and shapes against config.json before anything is written.
  model::Llama llama(cfg, 0);
  std::string weights;
  const auto tensors = io::load_hf_weights(run_dir, &weights);
  llama.load(tensors, weights);
  const auto target = dtype == "bf16" ? at::kBFloat16 : dtype == "f16" ? at::kHalf : at::kFloat;
  io::NamedTensors out;
  // MoE experts one tensor per expert, under the names save_pretrained writes (model/moe.h).
  for (auto& [name, t] : model::split_expert_tensors(cfg, llama.named_tensors())) out.emplace_back(name, t.to(target));
  fs::create_directories(out_dir);
  auto hf = model::to_hf_json(cfg);
  hf["torch_dtype"] = dtype == "bf16" ? "bfloat16" : dtype == "f16" ? "float16" : "float32";
  {
    std::ofstream f(out_dir + "/config.json");
    f << hf.dump(2) << "\n";
    if (!f) fail("cannot write ", out_dir, "/config.json");
  }
  io::save_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  copy_tokenizer(run_dir, out_dir);
  std::printf("exported %zu tensors (%s) to %s\n", out.size(), dtype.c_str(), out_dir.c_str());
  return 0;
}

}  // namespace shardlm::cli
