// The element-wise kernels of the shared-memory collectives (shm_group.h): reduce n equally long
// inputs in rank order into one output. A fixed order makes every element's result independent of
// which rank computed it, and 16-bit types are summed in float and rounded once, so results are
// bitwise identical on every rank. Blocks of a few thousand elements keep the accumulator in L1
// and let the compiler vectorize the inner loops.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/communicator.h"

namespace shardlm::comm::shm {

template <typename T> struct Acc { using type = T; };
template <> struct Acc<c10::BFloat16> { using type = float; };
template <> struct Acc<c10::Half> { using type = float; };

// out[i] = op(in[0][i], in[1][i], ..., in[n-1][i]); out may alias one of the inputs (element i is
// read before it is written). When out2 is given it receives a copy of out.
template <typename T, typename F>
void reduce_block_loop(T* out, T* out2, const T* const* in, int n, int64_t len, F f) {
  using A = typename Acc<T>::type;
  constexpr int64_t kBlock = 2048;
  A acc[kBlock];
  for (int64_t i0 = 0; i0 < len; i0 += kBlock) {
    const int64_t b = std::min(kBlock, len - i0);
    const T* first = in[0] + i0;
    for (int64_t j = 0; j < b; ++j) acc[j] = static_cast<A>(first[j]);
    for (int p = 1; p < n; ++p) {
      const T* src = in[p] + i0;
      for (int64_t j = 0; j < b; ++j) acc[j] = f(acc[j], static_cast<A>(src[j]));
    }
    T* dst = out + i0;
    for (int64_t j = 0; j < b; ++j) dst[j] = static_cast<T>(acc[j]);
    if (out2) std::memcpy(out2 + i0, dst, b * sizeof(T));
  }
}

template <typename T>
void reduce(T* out, T* out2, const T* const* in, int n, int64_t len, ReduceOp op) {
  using A = typename Acc<T>::type;
  switch (op) {
    case ReduceOp::Sum: return reduce_block_loop(out, out2, in, n, len, [](A a, A b) { return static_cast<A>(a + b); });
    case ReduceOp::Max: return reduce_block_loop(out, out2, in, n, len, [](A a, A b) { return b > a ? b : a; });
    case ReduceOp::Min: return reduce_block_loop(out, out2, in, n, len, [](A a, A b) { return b < a ? b : a; });
  }
}

}  // namespace shardlm::comm::shm
