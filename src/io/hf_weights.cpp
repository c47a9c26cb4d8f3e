// See hf_weights.h.
#include "io/hf_weights.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace shardlm::io {

NamedTensors load_hf_weights(const std::string& dir, std::string* source) {
  namespace fs = std::filesystem;
  const std::string single = dir + "/model.safetensors", index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) {
    if (source) *source = single;
    return load_safetensors(single);
  }
  if (!fs::exists(index_path)) {
    const bool torch_bin = fs::exists(dir + "/pytorch_model.bin") || fs::exists(dir + "/pytorch_model.bin.index.json");
    fail("'", dir, "' has neither model.safetensors nor model.safetensors.index.json",
         torch_bin ? "; it holds pytorch_model.bin (pickle), which shardlm does not read: save the model with "
                     "transformers' save_pretrained (safetensors, its default) first"
                   : "; give a Hugging Face model directory (config.json and safetensors weights)");
  }
  nlohmann::json index;
  try {
    std::ifstream(index_path) >> index;
  } catch (const std::exception& e) {
    fail("'", index_path, "' is not valid JSON: ", e.what());
  }
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    fail("'", index_path, "' has no weight_map object (tensor name -> shard file)");
  std::map<std::string, std::set<std::string>> by_file;  // file -> the tensors the index puts there
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it->is_string()) fail("'", index_path, "': weight_map['", it.key(), "'] must be a file name");
    const auto file = it->get<std::string>();
    if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
      fail("'", index_path, "': weight_map names '", file, "', which is not a file in the directory");
    by_file[file].insert(it.key());
  }
  NamedTensors out;
  for (const auto& [file, names] : by_file) {
    const std::string path = dir + "/" + file;
    if (!fs::exists(path)) fail("'", index_path, "' lists shard '", file, "', which is missing from ", dir);
    std::set<std::string> found;
    for (auto& [name, t] : load_safetensors(path)) {
      if (!names.count(name))
        fail("shard '", path, "' holds tensor ", name, ", which ", index_path, " does not list there");
      found.insert(name);
      out.emplace_back(name, std::move(t));
    }
    for (const auto& name : names)
      if (!found.count(name)) fail("'", index_path, "' puts tensor ", name, " in '", file, "', which lacks it");
  }
  if (source) *source = index_path + " (" + std::to_string(by_file.size()) + " shards)";
  return out;
}

}  // namespace shardlm::io
