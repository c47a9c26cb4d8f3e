#include "parallel/zero/flat_layout.h"

#include <algorithm>

#include "model/llama.h"

namespace shardlm::parallel {

FlatLayout FlatLayout::build(const model::ModelShape& shape, int dp_size) {
  FlatLayout layout;
  layout.dp_size = dp_size;
  for (const auto& unit : shape.units) {
    FlatUnit fu;
    fu.name = unit.name;
    fu.also_reads = unit.also_reads;
    for (size_t index : unit.params) {
      const auto& [name, dims] = shape.params[index];
      int64_t numel = 1;
      for (int64_t d : dims) numel *= d;
      fu.params.push_back({index, name, dims, fu.numel, numel, dims.size() >= 2});
      fu.numel += numel;
    }
    fu.padded_numel = (fu.numel + dp_size - 1) / dp_size * dp_size;
    fu.shard_numel = fu.padded_numel / dp_size;
    layout.units.push_back(std::move(fu));
  }
  return layout;
}

// From the tensors the model holds (after tensor parallelism has replaced them by its shards), not
// from the config: the layout is whatever this rank actually packs.
FlatLayout FlatLayout::build(const model::Llama& model, int dp_size, const std::vector<char>& only) {
  model::ModelShape held;
  for (const auto& p : model.parameters()) held.params.emplace_back(p.name, p.tensor.sizes().vec());
  held.units = model.units();
  if (!only.empty())
    for (auto& u : held.units) u.params.erase(std::remove_if(u.params.begin(), u.params.end(), [&](size_t i) { return !only[i]; }), u.params.end());
  return build(held, dp_size);
}

namespace {
int64_t sum(const std::vector<FlatUnit>& units, int64_t FlatUnit::*field) {
  int64_t n = 0;
  for (const auto& u : units) n += u.*field;
  return n;
}
}  // namespace

int64_t FlatLayout::numel() const { return sum(units, &FlatUnit::numel); }
int64_t FlatLayout::padded_numel() const { return sum(units, &FlatUnit::padded_numel); }
int64_t FlatLayout::shard_numel() const { return sum(units, &FlatUnit::shard_numel); }

int64_t FlatLayout::largest_unit_numel() const {
  int64_t n = 0;
  for (const auto& u : units) n = std::max(n, u.padded_numel);
  return n;
}

}  // namespace shardlm::parallel
