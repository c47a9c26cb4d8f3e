// See sharded_frozen_base.h.
#include "parallel/zero/sharded_frozen_base.h"

#include <ATen/ATen.h>

#include <utility>

#include "model/llama.h"
#include "model/quant/quantized_base.h"
#include "util/error.h"

namespace shardlm::parallel {

namespace {

int64_t frozen_shard_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The bytes of t (row-major) as uint8, zero-padded to `padded` bytes.
at::Tensor frozen_padded_bytes(const at::Tensor& t, int64_t padded) {
  auto out = at::zeros({padded}, at::TensorOptions().dtype(at::kByte).device(t.device()));
  if (t.numel() > 0) {
    const auto bytes = t.contiguous().view({-1}).view(at::kByte);
    out.narrow(0, 0, bytes.numel()).copy_(bytes);
  }
  return out;
}

// From the rows [shards, piece bytes] of the gathered pieces: columns [at, at + width) of every row,
// concatenated, their first `keep` bytes, as a fresh tensor of `dtype` (float32 or uint8).
at::Tensor frozen_columns(const at::Tensor& rows, int64_t at, int64_t width, int64_t keep, at::ScalarType dtype) {
  return rows.narrow(1, at, width).reshape({-1}).narrow(0, 0, keep).clone().view(dtype);
}

// The collective: every rank of `group` contributes its piece (the same number of elements on each)
// and receives all of them in rank order, [size x piece]. A frozen tensor needs no autograd function:
// no gradient flows back to the pieces.
at::Tensor all_gather_frozen_pieces(comm::Communicator& group, const at::Tensor& piece) {
  auto out = at::empty({group.size() * piece.numel()}, piece.options());
  group.all_gather(piece, out);
  return out;
}

}  // namespace

FourBitSplit four_bit_split(int64_t numel, bool double_quant, int shards) {
  FourBitSplit s;
  s.blocks = frozen_shard_ceil(numel, model::quant::kFourBitBlock);
  s.per_rank = frozen_shard_ceil(s.blocks, shards);
  s.packed_bytes = (numel + 1) / 2;
  s.absmax_entry = double_quant ? 1 : 4;
  if (double_quant) {
    s.nested = frozen_shard_ceil(s.blocks, model::quant::kNestedBlock);
    s.nested_per_rank = frozen_shard_ceil(s.nested, shards);
  }
  return s;
}

at::Tensor four_bit_piece(const model::quant::FourBit& q, int rank, int shards) {
  const auto s = four_bit_split(q.numel(), q.double_quant, shards);
  const int64_t codes = s.per_rank * FourBitSplit::kPackedPerBlock, absmax = s.per_rank * s.absmax_entry;
  std::vector<at::Tensor> parts = {frozen_padded_bytes(q.packed, shards * codes).narrow(0, rank * codes, codes),
                                   frozen_padded_bytes(q.absmax, shards * absmax).narrow(0, rank * absmax, absmax)};
  if (q.double_quant) {
    const int64_t nested = 4 * s.nested_per_rank;
    parts.push_back(frozen_padded_bytes(q.absmax2, shards * nested).narrow(0, rank * nested, nested));
  }
  return at::cat(parts);
}

model::quant::FourBit four_bit_from_pieces(const at::Tensor& gathered, const model::quant::FourBit& header, int shards) {
  const auto s = four_bit_split(header.numel(), header.double_quant, shards);
  const auto rows = gathered.view({shards, s.piece_bytes()});
  const int64_t codes = s.per_rank * FourBitSplit::kPackedPerBlock, absmax = s.per_rank * s.absmax_entry;
  auto q = header;
  q.packed = frozen_columns(rows, 0, codes, s.packed_bytes, at::kByte);
  q.absmax = frozen_columns(rows, codes, absmax, s.blocks * s.absmax_entry, header.double_quant ? at::kByte : at::kFloat);
  if (header.double_quant) q.absmax2 = frozen_columns(rows, codes + absmax, 4 * s.nested_per_rank, 4 * s.nested, at::kFloat);
  return q;
}

int64_t sharded_tensor_bytes(int64_t numel, int64_t element_bytes, int shards) {
  return frozen_shard_ceil(numel, shards) * element_bytes;
}

int64_t sharded_four_bit_bytes(int64_t numel, bool double_quant, int shards) {
  if (shards <= 1) return model::quant::four_bit_bytes(numel, double_quant);
  return four_bit_split(numel, double_quant, shards).piece_bytes() + (double_quant ? 4 : 0);  // + the offset
}

ShardedFrozenBase::ShardedFrozenBase(const model::FrozenBase& whole, comm::CommPtr group) : group_(std::move(group)) {
  at::NoGradGuard no_grad;
  const int rank = group_->rank(), shards = group_->size();
  const auto* quantized = dynamic_cast<const model::quant::QuantizedFrozenBase*>(&whole);
  if (quantized) compute_ = quantized->compute_dtype();
  entries_.reserve(whole.size());
  for (size_t k = 0; k < whole.size(); ++k) {
    Entry e;
    e.name = whole.name(k);
    if (quantized && quantized->quantized(k)) {
      const auto& q = quantized->four_bit(k);
      e.four_bit = true;
      e.shape = q.shape;
      e.numel = q.numel();
      e.piece = four_bit_piece(q, rank, shards);
      e.header = q;
      e.header.packed = e.header.absmax = e.header.absmax2 = at::Tensor();  // the storage lives in the pieces
    } else {
      const auto t = whole.weight(k).detach();  // a plain tensor: no collective, no dequantization
      e.shape = t.sizes().vec();
      e.numel = t.numel();
      if (!quantized) compute_ = t.scalar_type();
      if (e.numel == 0) {  // released (a pipeline stage that never runs the layer): released on every dp rank
        e.released = true;
        e.piece = t;
      } else {
        const int64_t per_rank = frozen_shard_ceil(e.numel, shards);
        auto padded = at::zeros({per_rank * shards}, t.options());
        padded.narrow(0, 0, e.numel).copy_(t.reshape({-1}));
        e.piece = padded.narrow(0, rank * per_rank, per_rank).clone();
      }
    }
    entries_.push_back(std::move(e));
  }
}

at::Tensor ShardedFrozenBase::weight(size_t k) const {
  const auto& e = entries_[k];
  if (e.released) return e.piece;
  at::NoGradGuard no_grad;
  // Collective: every rank of the group asks for k here, in the same order (sharded_frozen_base.h).
  const auto gathered = all_gather_frozen_pieces(*group_, e.piece);
  if (!e.four_bit) return gathered.narrow(0, 0, e.numel).view(e.shape);
  // QuantizedFrozenBase::weight on the rebuilt storage: bitsandbytes' dequantize_4bit, cast to the compute dtype.
  const auto q = four_bit_from_pieces(gathered, e.header, group_->size());
  return model::quant::dequantize_4bit(q, q.dtype).to(compute_);
}

int64_t ShardedFrozenBase::bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_) {
    if (e.released) continue;
    n += e.piece.numel() * static_cast<int64_t>(e.piece.element_size());
    if (e.four_bit && e.header.double_quant) n += static_cast<int64_t>(sizeof e.header.offset);
  }
  return n;
}

void ShardedFrozenBase::to(at::Device device, at::ScalarType dtype) {
  compute_ = dtype;
  for (auto& e : entries_) {
    if (e.released && e.four_bit) e.piece = at::empty({0}, e.piece.options().device(device).dtype(dtype));
    else if (e.four_bit || !e.piece.is_floating_point()) e.piece = e.piece.to(device);
    else e.piece = e.piece.to(device, dtype);  // element-wise: the same as splitting the converted tensor
  }
}

void ShardedFrozenBase::release(size_t k) {
  auto& e = entries_[k];
  e.released = true;
  e.piece = at::empty({0}, e.piece.options().dtype(e.four_bit ? compute_ : e.piece.scalar_type()));
}

void install_sharded_frozen_base(model::Llama& model, const comm::CommPtr& group) {
  if (!model.has_lora() || !group || group->size() < 2) return;
  model.set_frozen_base(std::make_shared<ShardedFrozenBase>(*model.frozen_base(), group));
}

}  // namespace shardlm::parallel
