// See quantized_base.h.
#include "plan/quantized_base.h"

#include "model/quant/four_bit.h"
#include "model/quant/quantized_base.h"
#include "parallel/zero/sharded_frozen_base.h"
#include "plan/plan_internal.h"

namespace shardlm::plan {

int64_t frozen_base_bytes(const model::ModelShape& frozen, const FrozenBaseFormat& format) {
  int64_t bytes = 0;
  for (const auto& [name, shape] : frozen.params)
    bytes += format.four_bit && model::quant::quantized_by_bitsandbytes(name)
                 ? parallel::sharded_four_bit_bytes(numel(shape), format.double_quant, format.shards)
                 : parallel::sharded_tensor_bytes(numel(shape), format.compute_bytes, format.shards);
  return bytes;
}

int64_t four_bit_linear_bytes(const model::ModelShape& frozen, bool double_quant) {
  int64_t bytes = 0;
  for (const auto& [name, shape] : frozen.params)
    if (model::quant::quantized_by_bitsandbytes(name)) bytes += model::quant::four_bit_bytes(numel(shape), double_quant);
  return bytes;
}

int64_t four_bit_linear_bf16_bytes(const model::ModelShape& frozen) {
  int64_t bytes = 0;
  for (const auto& [name, shape] : frozen.params)
    if (model::quant::quantized_by_bitsandbytes(name)) bytes += 2 * numel(shape);
  return bytes;
}

}  // namespace shardlm::plan
