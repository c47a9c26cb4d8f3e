// ZeRO stage 3 for a LoRA / QLoRA run's frozen base (model/lora.h FrozenBase): without it every
// data-parallel rank holds the whole base, so a ZeRO-3 LoRA run of a big model keeps the full model
// per rank even though its trainable units are sharded. Here each rank of the ZeRO group (the
// shard group with hybrid sharding) keeps 1/N of every frozen tensor, and weight(k) all-gathers it
// and returns the whole compute-dtype tensor, which the caller drops after use (the forward asks
// once per use in forward and again in backward). Frozen: no gradient, no optimizer state, no master
// copy, never stepped; so the gather is a plain collective, no autograd function.
//
// - Tensors kept in their dtype (PlainFrozenBase, and QLoRA's embedding, norms and head): flattened
//   and padded to a multiple of N elements like a ZeRO-3 unit; rank r keeps [r·S, (r+1)·S).
// - QLoRA's 4-bit tensors (model/quant/four_bit.h): the quantized storage is split, never the
//   dequantized weight, along bitsandbytes' blocks of 64: rank r keeps the packed codes (32 bytes a
//   block) and absmax entries of blocks [r·S, (r+1)·S), S = ceil(blocks / N), and, with double
//   quantization, its share of the absmax2 entries (whole float32 entries; the offset, 4 bytes, on
//   every rank), as one byte string. The gather rebuilds the exact storage, so the dequantized
//   weight is bit-identical to the replicated store's.
//
// Every rank of the group calls weight(k) for the same k in the same order: the model's forward,
// activation checkpointing's replay and the backward run the same units in the same order on every
// data-parallel rank (pipeline stages: every rank of one dp group is the same stage), and a tensor
// released on one rank (release(k), a stage that never runs the layer) is released on all of them.
// install_sharded_frozen_base (parallelize.cpp, ZeRO stage 3 with LoRA only) replaces the model's
// store after tensor parallelism's split and the pipeline's release; the trainer's later
// to(device, dtype) converts the shards (element-wise, so it commutes with the split), so the whole
// base never reaches the device.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/lora.h"
#include "model/quant/four_bit.h"

namespace shardlm::model {
class Llama;
}

namespace shardlm::parallel {

// How a 4-bit tensor of n elements splits over `shards` ranks (whole blocks per rank).
struct FourBitSplit {
  int64_t blocks = 0, per_rank = 0;       // blocks of 64, and each rank's count (S)
  int64_t packed_bytes = 0;               // ceil(n / 2): the storage's codes
  int64_t absmax_entry = 4;               // bytes of one absmax entry: float32, or uint8 when double-quantized
  int64_t nested = 0, nested_per_rank = 0;  // absmax2 entries (double quantization) and each rank's count
  int64_t piece_bytes() const { return per_rank * (kPackedPerBlock + absmax_entry) + 4 * nested_per_rank; }
  static constexpr int64_t kPackedPerBlock = model::quant::kFourBitBlock / 2;
};
FourBitSplit four_bit_split(int64_t numel, bool double_quant, int shards);

// Rank `rank`'s piece of q's storage (uint8 [split.piece_bytes()]): its blocks' codes, their absmax
// entries, its absmax2 entries, each zero-padded past the end.
at::Tensor four_bit_piece(const model::quant::FourBit& q, int rank, int shards);
// The storage again from every rank's piece in rank order (their concatenation, `gathered`): q with
// packed, absmax and absmax2 rebuilt; `header` gives type, shape, dtype, offset (its tensors unused).
model::quant::FourBit four_bit_from_pieces(const at::Tensor& gathered, const model::quant::FourBit& header, int shards);

// The bytes one of `shards` ranks keeps: a tensor of n elements in `element_bytes` per element, and a
// 4-bit tensor of n elements (the planner's formula: plan/quantized_base.h). shards 1: the whole.
int64_t sharded_tensor_bytes(int64_t numel, int64_t element_bytes, int shards);
int64_t sharded_four_bit_bytes(int64_t numel, bool double_quant, int shards);

class ShardedFrozenBase : public model::FrozenBase {
 public:
  // This rank's pieces of `whole` (a PlainFrozenBase or a quant::QuantizedFrozenBase) over `group`.
  ShardedFrozenBase(const model::FrozenBase& whole, comm::CommPtr group);
  size_t size() const override { return entries_.size(); }
  const std::string& name(size_t k) const override { return entries_[k].name; }
  // Collective over the group: the whole weight k, gathered (and dequantized); not kept.
  at::Tensor weight(size_t k) const override;
  int64_t bytes() const override;  // this rank's pieces
  void to(at::Device device, at::ScalarType dtype) override;
  void release(size_t k) override;

 private:
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    bool released = false;
    at::Tensor piece;                        // this rank's piece (the dtype's elements, or 4-bit bytes)
    bool four_bit = false;
    model::quant::FourBit header;            // 4-bit: type, shape, dtype, offset (no storage)
  };
  std::vector<Entry> entries_;
  comm::CommPtr group_;
  at::ScalarType compute_ = at::kFloat;  // what a 4-bit weight dequantizes to
};

// ZeRO stage 3 with LoRA (parallelize.cpp): replaces model's frozen base by its ShardedFrozenBase over
// `group`, the ZeRO shard group; nothing without adapters or with a group of one rank.
void install_sharded_frozen_base(model::Llama& model, const comm::CommPtr& group);

}  // namespace shardlm::parallel
