// See hf_export.h.
#include "model/hf_export.h"

#include <filesystem>

#include "data/tokenizer/tokenizer.h"
#include "io/safetensors.h"
#include "model/moe.h"

namespace shardlm::model {

void write_hf_model_dir(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                        const LlamaConfig& cfg, const std::string& tokenizer) {
  // Experts one tensor per expert, under the names save_pretrained writes (model/moe.h).
  io::save_safetensors(dir + "/model.safetensors", split_expert_tensors(cfg, tensors), {{"format", "pt"}});
  write_hf_config(dir + "/config.json", cfg);
  if (tokenizer.empty()) return;
  const auto file = data::tokenizer_file(tokenizer);
  namespace fs = std::filesystem;
  fs::copy_file(file.path, dir + "/" + file.name, fs::copy_options::overwrite_existing);
  // Its tokenizer_config.json, chat template and generation_config.json, so the model chats as before.
  const fs::path from = fs::path(file.path).parent_path();
  for (const std::string& name : data::tokenizer_companion_files(tokenizer)) {
    fs::create_directories((fs::path(dir) / name).parent_path());
    fs::copy_file(from / name, fs::path(dir) / name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace shardlm::model
