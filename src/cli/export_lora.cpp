// `shardlm export` for a LoRA run (train/lora_config.h): the run directory holds a PEFT adapter
// (adapter_model.safetensors + adapter_config.json). Without --merge the adapter is written as it is
// (in the chosen dtype); with --merge the base (--base, else the adapter's base_model_name_or_path)
// gets every adapter merged in (W + scaling B A) and is written as a Hugging Face model directory.
#include "cli/export_lora.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/hf_weights.h"
#include "io/safetensors.h"
#include "model/hf_export.h"
#include "model/llama.h"
#include "train/lora_config.h"
#include "util/error.h"

namespace shardlm::cli {

bool is_adapter_dir(const std::string& dir) { return std::filesystem::exists(dir + "/adapter_model.safetensors"); }

std::string export_adapter(const std::string& run_dir, const std::string& out_dir, at::ScalarType dtype, bool merge,
                    std::string base) {
  namespace fs = std::filesystem;
  nlohmann::json peft;
  {
    std::ifstream in(run_dir + "/adapter_config.json");
    if (!in) fail(run_dir, " holds adapter_model.safetensors but no adapter_config.json");
    peft = nlohmann::json::parse(in);
  }
  fs::create_directories(out_dir);
  if (!merge) {
    io::NamedTensors out;
    for (auto& [name, t] : io::load_safetensors(run_dir + "/adapter_model.safetensors")) out.emplace_back(name, t.to(dtype));
    io::save_safetensors(out_dir + "/adapter_model.safetensors", out, {{"format", "pt"}});
    fs::copy_file(run_dir + "/adapter_config.json", out_dir + "/adapter_config.json", fs::copy_options::overwrite_existing);
    std::printf("exported the LoRA adapter (%zu tensors) to %s (PeftModel.from_pretrained reads it)\n", out.size(),
                out_dir.c_str());
    return "";
  }
  if (base.empty() && peft.contains("base_model_name_or_path") && peft["base_model_name_or_path"].is_string())
    base = peft["base_model_name_or_path"].get<std::string>();
  if (base.empty() || !fs::exists(base + "/config.json"))
    fail("export --merge: the base model directory is unknown or has no config.json ('", base,
         "'); name it with --base DIR (the run's init)");
  const auto cfg = model::read_hf_config(base + "/config.json");
  model::Llama llama(cfg, 0);
  std::string weights;
  llama.load(io::load_hf_weights(base, &weights), weights);
  train::LoraConfig lora;
  lora.enabled = true;
  lora.init_from = run_dir;
  train::apply_lora(llama, lora, 0);
  io::NamedTensors out;
  for (auto& [name, t] : model::split_expert_tensors(cfg, llama.merged_tensors())) out.emplace_back(name, t.to(dtype));
  auto hf = model::to_hf_json(cfg);
  hf["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  {
    std::ofstream f(out_dir + "/config.json");
    f << hf.dump(2) << "\n";
    if (!f) fail("cannot write ", out_dir, "/config.json");
  }
  io::save_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  std::printf("exported %zu tensors of %s with the adapter of %s merged to %s\n", out.size(), base.c_str(), run_dir.c_str(),
              out_dir.c_str());
  return base;
}

}  // namespace shardlm::cli
