// Reads a sharded checkpoint (checkpoint.h) by global parameter name and element range, whatever
// layout wrote it: the pieces of every shard file are indexed from the files' headers, and a
// request for "elements [b, e) of <name>'s tensor as tensor-parallel rank r of t holds it" is served
// by reading only the overlapping bytes when the saved tensor-parallel size is t (any dp size, ZeRO
// stage or pipeline split), or else by joining that one tensor from its saved TP pieces and cutting
// the new piece (tp_layout.h): one tensor at a time, never the whole model.
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/llama_config.h"

namespace shardlm::train {

// How a shard file describes one saved piece (its safetensors metadata "pieces", one per tensor).
struct CheckpointPiece {
  std::string key;    // tensor name in the file: "<kind>/<name>@<begin>"
  std::string kind;   // master | exp_avg | exp_avg_sq | param (compute dtype) | exp_avg[_sq].absmax (8-bit, by block)
                      // | compensation (Kahan summation over bf16 masters)
  std::string name;   // global HF parameter name
  int64_t begin = 0;  // first element inside the rank's local (tensor-parallel) tensor
  int64_t numel = 0;
  int tp_index = 0, tp_size = 1;
  std::vector<int64_t> local_shape;  // the tensor-parallel piece's shape (the HF shape when tp_size is 1)
};

class CheckpointReader {
 public:
  // `files` are paths of shard files; `cfg` the model they hold (for the tensor-parallel split).
  CheckpointReader(const std::vector<std::string>& files, model::LlamaConfig cfg);
  // Elements [begin, begin + numel) of `kind` of `name`, as tensor-parallel rank r of t holds it
  // (shape local_shape), in the saved dtype, on the CPU. Fails naming the tensor when the pieces
  // do not cover the range.
  at::Tensor read(const std::string& kind, const std::string& name, int t, int r,
                  const std::vector<int64_t>& local_shape, int64_t begin, int64_t numel);
  // Whether any piece of `kind` of `name` was saved.
  bool has(const std::string& kind, const std::string& name) const { return by_name_.count(kind + "/" + name) != 0; }
  // Every saved piece of file f, read one at a time (verification).
  size_t files() const { return files_.size(); }
  const std::vector<CheckpointPiece>& pieces_of(size_t f) const { return files_[f].pieces; }
  at::Tensor read_piece(size_t f, const CheckpointPiece& p) { return read_elements(f, p.key, 0, p.numel); }

 private:
  struct File {
    std::string path;
    uint64_t data_start = 0;
    std::map<std::string, io::TensorInfo> tensors;
    std::vector<CheckpointPiece> pieces;
  };
  struct Ref {
    size_t file;
    const CheckpointPiece* piece;
  };
  at::Tensor read_elements(size_t f, const std::string& key, int64_t from, int64_t n);
  at::Tensor fill(const std::vector<Ref>& refs, int tp_index, int64_t begin, int64_t numel, const std::string& what);

  std::vector<File> files_;
  std::map<std::string, std::vector<Ref>> by_name_;  // "<kind>/<name>" -> pieces
  model::LlamaConfig cfg_;
  std::string cached_key_;  // the last re-split tensor, so its ranges are cut from one join
  at::Tensor cached_;
};

// The metadata of a shard file's pieces, as JSON text, and back.
std::string pieces_to_json(const std::vector<CheckpointPiece>& pieces);
std::vector<CheckpointPiece> pieces_from_json(const std::string& text, const std::string& path);

}  // namespace shardlm::train
