// See chunks.h.
#include "parallel/context/chunks.h"

#include <ATen/ATen.h>

#include "util/error.h"

namespace shardlm::parallel::context {

at::Tensor chunk_positions(int64_t T, int c, int rank, const at::Device& device) {
  if (c < 1 || T % (2 * c) != 0 || rank < 0 || rank >= c)
    fail("context parallelism: a sequence of ", T, " positions does not split into 2 x ", c, " chunks (internal error)");
  const int64_t s = T / (2 * c);
  const auto on = at::TensorOptions(at::kLong).device(device);
  return at::cat({at::arange(rank * s, (rank + 1) * s, on), at::arange((2 * c - 1 - rank) * s, (2 * c - rank) * s, on)});
}

at::Tensor gathered_positions(int64_t T, int c, const at::Device& device) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < c; ++r) all.push_back(chunk_positions(T, c, r, device));
  return at::cat(all);
}

at::Tensor split_sequence(const at::Tensor& x, int c, int rank) {
  const int64_t T = x.size(1), s = T / (2 * c);
  if (T % (2 * c) != 0) fail("context parallelism: ", T, " positions do not split into 2 x ", c, " chunks (internal error)");
  return at::cat({x.narrow(1, rank * s, s), x.narrow(1, (2 * c - 1 - rank) * s, s)}, 1);
}

at::Tensor blocked_between(const at::Tensor& q_pos, const at::Tensor& k_pos, int64_t window, const at::Tensor& q_segments,
                           const at::Tensor& k_segments) {
  const auto q = q_pos.unsqueeze(1), k = k_pos.unsqueeze(0);
  auto blocked = k.gt(q);
  if (window > 0) blocked = blocked.logical_or(k.le(q - window));
  if (!q_segments.defined()) return blocked;
  const auto other_sample = q_segments.unsqueeze(2).ne(k_segments.unsqueeze(1)).unsqueeze(1);  // [B, 1, Tq, Tk]
  return blocked.logical_or(other_sample);
}

}  // namespace shardlm::parallel::context
