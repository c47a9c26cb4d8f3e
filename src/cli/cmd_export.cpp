// `shardlm export --run DIR --out DIR [--dtype f32|bf16|f16]`: writes a Hugging Face model
// directory (config.json + model.safetensors, loadable by transformers' LlamaForCausalLM) from a
// training run's output directory or any shardlm/HF model directory.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "util/error.h"

namespace shardlm::cli {

int run_export(int argc, char** argv) {
  CLI::App app{"Export a trained model as a Hugging Face directory", "shardlm export"};
  std::string run_dir, out_dir, dtype = "f32";
  app.add_option("--run", run_dir, "training run directory (out_dir) holding config.json + model.safetensors")->required();
  app.add_option("--out", out_dir, "directory to write")->required();
  app.add_option("--dtype", dtype, "stored dtype")->check(CLI::IsMember({"f32", "bf16", "f16"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  namespace fs = std::filesystem;
  const auto cfg = model::read_hf_config(run_dir + "/config.json");
  // Loading into the model validates names and shapes against config.json before anything is written.
  model::Llama llama(cfg, 0);
  const std::string weights = run_dir + "/model.safetensors";
  llama.load(io::load_safetensors(weights), weights);
  const auto target = dtype == "bf16" ? at::kBFloat16 : dtype == "f16" ? at::kHalf : at::kFloat;
  io::NamedTensors out;
  for (auto& [name, t] : llama.named_tensors()) out.emplace_back(name, t.to(target));
  fs::create_directories(out_dir);
  auto hf = model::to_hf_json(cfg);
  hf["torch_dtype"] = dtype == "bf16" ? "bfloat16" : dtype == "f16" ? "float16" : "float32";
  {
    std::ofstream f(out_dir + "/config.json");
    f << hf.dump(2) << "\n";
    if (!f) fail("cannot write ", out_dir, "/config.json");
  }
  io::save_safetensors(out_dir + "/model.safetensors", out, {{"format", "pt"}});
  if (fs::exists(run_dir + "/tokenizer.model"))
    fs::copy_file(run_dir + "/tokenizer.model", out_dir + "/tokenizer.model", fs::copy_options::overwrite_existing);
  std::printf("exported %zu tensors (%s) to %s\n", out.size(), dtype.c_str(), out_dir.c_str());
  return 0;
}

}  // namespace shardlm::cli
