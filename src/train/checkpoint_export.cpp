// See checkpoint_export.h.
#include "train/checkpoint_export.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/llama.h"
#include "model/moe.h"
#include "train/checkpoint.h"
#include "train/checkpoint_reader.h"
#include "util/error.h"

namespace shardlm::train {
namespace fs = std::filesystem;
namespace {

struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t bytes;
  std::string source;                 // the checkpoint's parameter (MoE experts: one file tensor per expert)
  std::vector<int64_t> source_shape;  // its shape
  int64_t begin = 0;                  // the file tensor's first element in it
};

// One safetensors file written as its tensors arrive: the header (names, shapes, offsets) is known
// from the model's shape before any data is read.
void write_streaming(const std::string& path, const std::vector<Entry>& entries, at::ScalarType dtype,
                     const std::function<at::Tensor(const Entry&)>& produce) {
  nlohmann::json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const auto& e : entries) {
    header[e.name] = {{"dtype", io::safetensors_dtype_name(dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.bytes}}};
    offset += e.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& e : entries) {
    const auto t = produce(e).to(dtype).contiguous();
    if (t.numel() * static_cast<int64_t>(t.element_size()) != e.bytes) fail("internal: export size of ", e.name);
    f.write(static_cast<const char*>(t.data_ptr()), e.bytes);
  }
  f.flush();
  if (!f) fail("cannot write '", tmp, "' (disk full?)");
  f.close();
  fs::rename(tmp, path);
}

bool inside(const fs::path& child, const fs::path& parent) {
  const auto c = fs::weakly_canonical(child), p = fs::weakly_canonical(parent);
  auto ci = c.begin();
  for (auto pi = p.begin(); pi != p.end(); ++pi, ++ci)
    if (ci == c.end() || *ci != *pi) return false;
  return true;
}

}  // namespace

ExportResult export_checkpoint(const std::string& run_dir, const std::string& out_dir, at::ScalarType dtype,
                               int64_t max_shard_bytes) {
  if (inside(out_dir, checkpoints_root(run_dir)))
    fail("--out '", out_dir, "' is inside the checkpoints it exports from ('", checkpoints_root(run_dir),
         "'); choose a directory outside them");
  ExportResult r;
  r.checkpoint = newest_usable_checkpoint(run_dir, [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); });
  if (r.checkpoint.empty()) fail("'", run_dir, "' holds no sharded checkpoint (", checkpoints_root(run_dir), ")");
  const auto cfg = model::read_hf_config(r.checkpoint + "/config.json");
  std::ifstream mf(r.checkpoint + "/checkpoint.json");
  nlohmann::json meta;
  mf >> meta;
  std::vector<std::string> files;
  for (const auto& f : meta.at("files")) files.push_back(r.checkpoint + "/" + f.at("file").get<std::string>());
  CheckpointReader reader(files, cfg);

  std::vector<std::vector<Entry>> groups(1);
  int64_t in_group = 0;
  const int64_t es = static_cast<int64_t>(at::elementSize(dtype));
  for (const auto& [name, shape] : model::describe(cfg).params) {
    // MoE experts are written one tensor per expert, as save_pretrained writes them (model/moe.h).
    for (const auto& slice : model::hf_file_slices(cfg, name, shape)) {
      int64_t numel = 1;
      for (auto d : slice.shape) numel *= d;
      const Entry e{slice.name, slice.shape, numel * es, name, shape, slice.begin};
      if (max_shard_bytes > 0 && in_group > 0 && in_group + e.bytes > max_shard_bytes) {
        groups.emplace_back();
        in_group = 0;
      }
      groups.back().push_back(e);
      in_group += e.bytes;
      r.bytes += e.bytes;
      ++r.tensors;
    }
  }
  fs::create_directories(out_dir);
  auto produce = [&](const Entry& e) {
    int64_t numel = 1;
    for (auto d : e.shape) numel *= d;
    return reader.read("master", e.source, 1, 0, e.source_shape, e.begin, numel).view(e.shape);
  };
  if (max_shard_bytes <= 0) {
    write_streaming(out_dir + "/model.safetensors", groups[0], dtype, produce);
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", r.bytes}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t g = 0; g < groups.size(); ++g) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
      write_streaming(out_dir + "/" + name, groups[g], dtype, produce);
      for (const auto& e : groups[g]) index["weight_map"][e.name] = name;
    }
    std::ofstream(out_dir + "/model.safetensors.index.json") << index.dump(2) << "\n";
  }
  r.files = static_cast<int64_t>(groups.size());
  auto hf = model::to_hf_json(cfg);
  hf["torch_dtype"] = model::hf_dtype_name(dtype);
  std::ofstream(out_dir + "/config.json") << hf.dump(2) << "\n";
  return r;
}

}  // namespace shardlm::train
