// See checkpoint_reader.h.
#include "train/checkpoint_reader.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallel/tensor/tp_layout.h"
#include "util/error.h"

namespace shardlm::train {

std::string pieces_to_json(const std::vector<CheckpointPiece>& pieces) {
  auto j = nlohmann::json::array();
  for (const auto& p : pieces)
    j.push_back({{"key", p.key}, {"kind", p.kind}, {"name", p.name}, {"begin", p.begin}, {"numel", p.numel},
                 {"tp_index", p.tp_index}, {"tp_size", p.tp_size}, {"local_shape", p.local_shape}});
  return j.dump();
}

std::vector<CheckpointPiece> pieces_from_json(const std::string& text, const std::string& path) {
  std::vector<CheckpointPiece> out;
  try {
    for (const auto& j : nlohmann::json::parse(text)) {
      CheckpointPiece p;
      p.key = j.at("key");
      p.kind = j.at("kind");
      p.name = j.at("name");
      p.begin = j.at("begin");
      p.numel = j.at("numel");
      p.tp_index = j.at("tp_index");
      p.tp_size = j.at("tp_size");
      p.local_shape = j.at("local_shape").get<std::vector<int64_t>>();
      out.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint shard '", path, "' has unreadable piece metadata (", e.what(), ")");
  }
  return out;
}

CheckpointReader::CheckpointReader(const std::vector<std::string>& files, model::LlamaConfig cfg)
    : cfg_(std::move(cfg)) {
  files_.resize(files.size());
  for (size_t f = 0; f < files.size(); ++f) {
    auto& file = files_[f];
    file.path = files[f];
    std::map<std::string, std::string> meta;
    for (auto& info : io::read_safetensors_header(file.path, &meta)) file.tensors[info.name] = info;
    std::ifstream in(file.path, std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);  // little-endian, as every supported host
    file.data_start = 8 + header_len;
    if (!meta.count("pieces")) fail("checkpoint shard '", file.path, "' has no piece metadata; it is not a shard file");
    file.pieces = pieces_from_json(meta["pieces"], file.path);
    for (const auto& p : file.pieces) {
      const auto it = file.tensors.find(p.key);
      if (it == file.tensors.end() || it->second.shape.size() != 1 || it->second.shape[0] != p.numel)
        fail("checkpoint shard '", file.path, "': tensor ", p.key, " is missing or not of ", p.numel, " elements");
    }
  }
  for (size_t f = 0; f < files_.size(); ++f)
    for (const auto& p : files_[f].pieces) by_name_[p.kind + "/" + p.name].push_back({f, &p});
}

at::Tensor CheckpointReader::read_elements(size_t f, const std::string& key, int64_t from, int64_t n) {
  const auto& file = files_[f];
  const auto& info = file.tensors.at(key);
  const auto dtype = io::safetensors_scalar_type(info.dtype);
  auto out = at::empty({n}, dtype);
  const int64_t es = static_cast<int64_t>(at::elementSize(dtype));
  std::ifstream in(file.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(file.data_start + info.begin + from * es));
  in.read(static_cast<char*>(out.data_ptr()), n * es);
  if (!in) fail("checkpoint shard '", file.path, "' is truncated: tensor ", key, " cannot be read");
  return out;
}

// Elements [begin, begin + numel) of the local tensor of TP rank `tp_index`, from the pieces that
// overlap them (identical copies, e.g. a replicated or tied tensor saved twice, are read once).
at::Tensor CheckpointReader::fill(const std::vector<Ref>& refs, int tp_index, int64_t begin, int64_t numel,
                                  const std::string& what) {
  std::vector<Ref> mine;
  for (const auto& r : refs)
    if (r.piece->tp_index == tp_index) mine.push_back(r);
  std::sort(mine.begin(), mine.end(), [](const Ref& a, const Ref& b) { return a.piece->begin < b.piece->begin; });
  at::Tensor out;
  int64_t cursor = begin;
  const int64_t end = begin + numel;
  for (const auto& r : mine) {
    const int64_t pb = r.piece->begin, pe = pb + r.piece->numel;
    if (pe <= cursor) continue;
    if (pb >= end || cursor >= end) break;
    if (pb > cursor) break;  // a gap: reported below
    const int64_t n = std::min(pe, end) - cursor;
    auto part = read_elements(r.file, r.piece->key, cursor - pb, n);
    if (!out.defined()) out = at::empty({numel}, part.options());
    out.narrow(0, cursor - begin, n).copy_(part);
    cursor += n;
  }
  if (cursor < end)
    fail("the checkpoint does not hold elements [", cursor, ", ", end, ") of ", what, " (tensor-parallel rank ",
         tp_index, "); a shard file is missing from it");
  return out;
}

at::Tensor CheckpointReader::read(const std::string& kind, const std::string& name, int t, int r,
                                  const std::vector<int64_t>& local_shape, int64_t begin, int64_t numel) {
  const std::string what = kind + " of " + name;
  const auto it = by_name_.find(kind + "/" + name);
  if (it == by_name_.end()) fail("the checkpoint holds no ", what, "; it was written for another model");
  const auto& refs = it->second;
  const int saved_t = refs.front().piece->tp_size;
  if (saved_t == t) {
    for (const auto& ref : refs)
      if (ref.piece->local_shape != local_shape)
        fail("the checkpoint's ", what, " has shape ", at::IntArrayRef(ref.piece->local_shape),
             " per tensor-parallel rank, this run needs ", at::IntArrayRef(local_shape));
    return fill(refs, r, begin, numel, what);
  }
  // Another tensor-parallel size: join the saved pieces into the HF tensor, cut this rank's.
  const std::string key = what + "/" + std::to_string(t) + "/" + std::to_string(r);
  if (cached_key_ != key) {
    std::vector<at::Tensor> parts;
    for (int q = 0; q < saved_t; ++q) {
      const CheckpointPiece* shape_of = nullptr;
      for (const auto& ref : refs)
        if (ref.piece->tp_index == q) shape_of = ref.piece;
      if (!shape_of) fail("the checkpoint holds no piece of ", what, " for tensor-parallel rank ", q, " of ", saved_t);
      int64_t n = 1;
      for (auto d : shape_of->local_shape) n *= d;
      parts.push_back(fill(refs, q, 0, n, what).view(shape_of->local_shape));
    }
    const auto full = saved_t == 1 ? parts[0] : parallel::tp::unshard(parts, name, cfg_);
    cached_ = (t == 1 ? full : parallel::tp::shard(full, name, cfg_, t, r)).contiguous().view({-1});
    cached_key_ = key;
    int64_t want = 1;
    for (auto d : local_shape) want *= d;
    if (cached_.numel() != want)
      fail("the checkpoint's ", what, " re-split for tensor-parallel rank ", r, " of ", t, " has ", cached_.numel(),
           " elements, this run needs ", want);
  }
  return cached_.narrow(0, begin, numel);
}

}  // namespace shardlm::train
