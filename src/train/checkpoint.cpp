#include "train/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "util/error.h"

namespace shardlm::train {
namespace fs = std::filesystem;

std::string checkpoint_dir(const std::string& out_dir) { return out_dir + "/checkpoint"; }

bool checkpoint_exists(const std::string& out_dir) { return fs::exists(checkpoint_dir(out_dir) + "/state.json"); }

void save_checkpoint(const std::string& out_dir, const model::Llama& model, const optim::AdamW& opt, int64_t step) {
  const std::string final_dir = checkpoint_dir(out_dir), tmp = final_dir + ".tmp", old = final_dir + ".old";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  io::save_safetensors(tmp + "/model.safetensors", model.named_tensors(), {{"format", "pt"}});
  io::save_safetensors(tmp + "/optimizer.safetensors", opt.state(), {{"optimizer", "AdamW"}});
  {
    std::ofstream f(tmp + "/state.json");
    f << nlohmann::json{{"step", step}, {"optimizer_steps", opt.steps_taken()}}.dump(2) << "\n";
    if (!f) fail("cannot write checkpoint state to '", tmp, "/state.json' (disk full?)");
  }
  model::write_hf_config(tmp + "/config.json", model.config());
  // Swap in: the previous checkpoint stays complete until the new one is.
  fs::remove_all(old);
  if (fs::exists(final_dir)) fs::rename(final_dir, old);
  fs::rename(tmp, final_dir);
  fs::remove_all(old);
}

int64_t load_checkpoint(const std::string& out_dir, model::Llama& model, optim::AdamW& opt) {
  const std::string dir = checkpoint_dir(out_dir);
  nlohmann::json state;
  try {
    std::ifstream f(dir + "/state.json");
    if (!f) fail("cannot open '", dir, "/state.json'");
    f >> state;
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint '", dir, "/state.json' is corrupt (", e.what(), "); delete the checkpoint directory to start over");
  }
  if (!state.contains("step") || !state["step"].is_number_integer())
    fail("checkpoint '", dir, "/state.json' has no integer \"step\"");
  const int64_t step = state["step"].get<int64_t>();
  const auto saved = model::read_hf_config(dir + "/config.json");
  if (model::to_hf_json(saved) != model::to_hf_json(model.config()))
    fail("checkpoint '", dir, "' was written for another model shape (", dir,
         "/config.json); resume with the same model config or use another out_dir");
  model.load(io::load_safetensors(dir + "/model.safetensors"), dir + "/model.safetensors");
  std::map<std::string, at::Tensor> moments;
  for (auto& [name, t] : io::load_safetensors(dir + "/optimizer.safetensors")) moments[name] = t;
  try {
    opt.load_state(moments, state.value("optimizer_steps", step));
  } catch (const Error& e) {
    fail("checkpoint '", dir, "/optimizer.safetensors': ", e.what());
  }
  return step;
}

}  // namespace shardlm::train
