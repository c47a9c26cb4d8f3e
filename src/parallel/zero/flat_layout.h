// Where every parameter lives in the flat ZeRO buffers. Each unit (embedding; each decoder layer;
// final norm + head) packs its parameters, in model order, into one contiguous buffer padded to a
// multiple of the data-parallel size N; rank r owns elements [r*S, (r+1)*S) with S = padded / N.
// This is plain data: the ZeRO engine, checkpoints, memory accounting and the planner all read
// it, so they cannot disagree about sizes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::model {
class Llama;
struct ModelShape;
}

namespace shardlm::parallel {

struct FlatParam {
  size_t param_index;  // into Llama::parameters()
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset;      // element offset inside the unit's flat buffer
  int64_t numel;
  bool decay;          // weight decay applies (2+ dimensions)
};

struct FlatUnit {
  std::string name;
  std::vector<FlatParam> params;
  std::vector<size_t> also_reads;  // other units this unit's forward reads (tied head -> embedding)
  int64_t numel = 0;         // sum of parameter sizes
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the dp size
  int64_t shard_numel = 0;   // padded_numel / dp size
};

struct FlatLayout {
  int dp_size = 1;
  std::vector<FlatUnit> units;
  int64_t numel() const;         // Ψ, the parameter count
  int64_t padded_numel() const;  // Ψ plus padding
  int64_t shard_numel() const;   // elements each rank owns, all units together
  int64_t largest_unit_numel() const;

  // From the parameters the model holds (their shapes: tensor-parallel shards where TP applies).
  // only: when not empty, the parameters to pack (the others are left out of their units).
  static FlatLayout build(const model::Llama& model, int dp_size, const std::vector<char>& only = {});
  static FlatLayout build(const model::ModelShape& shape, int dp_size);
};

}  // namespace shardlm::parallel
