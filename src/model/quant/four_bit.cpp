// See four_bit.h. Quantize and dequantize are written with the same ATen operations, in the same
// order, as bitsandbytes' Python (its default backend's quantize_4bit), so each rounding is the same
// one; they run on the device the tensor lives on.
#include "model/quant/four_bit.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "model/quant/dynamic_map.h"
#include "util/error.h"

namespace shardlm::model::quant {

namespace {

// bitsandbytes' get_4bit_type: NF4's table as torch.tensor stores its Python floats (float32), and
// FP4's bit patterns [0, 0.0625, 8, 12, 4, 6, 2, 3] with sign, divided by their largest magnitude (12)
// in float32. Its Python list writes FP4's code 8 as the integer -0, which is +0.0; its C++ CPU kernel
// (cpu_ops.cpp fp4_lut) writes -0.0f. negative_zero picks the second.
std::array<float, 16> make_code(FourBitType t, bool negative_zero = false) {
  if (t == FourBitType::NF4)
    return {-0x1p+0f,          -0x1.647362p-1f, -0x1.0cd66p-1f,  -0x1.94654p-2f, -0x1.23449ap-2f, -0x1.7a6a7ep-3f,
            -0x1.74f0e2p-4f,   0.0f,            0x1.45f5fep-4f,  0x1.4995c6p-3f, 0x1.f809bap-3f,  0x1.5a0674p-2f,
            0x1.c3497p-2f,     0x1.200f56p-1f,  0x1.722766p-1f,  0x1p+0f};
  const float bits[16] = {0.0f, 0.0625f, 8.0f, 12.0f, 4.0f, 6.0f, 2.0f, 3.0f,
                          -0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  std::array<float, 16> code{};
  for (int i = 0; i < 16; ++i) code[i] = bits[i] / 12.0f;
  if (!negative_zero) code[8] = 0.0f;
  return code;
}

const std::array<float, 16> kNf4 = make_code(FourBitType::NF4);
const std::array<float, 16> kFp4 = make_code(FourBitType::FP4);
const std::array<float, 16> kFp4Kernel = make_code(FourBitType::FP4, true);

at::Tensor code_tensor(FourBitType t, const at::Device& device) {
  return at::from_blob(const_cast<float*>(four_bit_code(t)), {16}, at::kFloat).to(device);
}

// The table bitsandbytes' CPU dequantize_4bit reads: its C++ kernel's (FP4's code 8 is -0), except for
// a weight whose last dimension is odd, which it sends to its Python fallback (code 8 is +0).
at::Tensor dequantize_table(const FourBit& q) {
  const bool kernel = q.type == FourBitType::FP4 && !q.shape.empty() && q.shape.back() % 2 == 0;
  if (!kernel) return code_tensor(q.type, q.packed.device());
  return at::from_blob(const_cast<float*>(kFp4Kernel.data()), {16}, at::kFloat).to(q.packed.device());
}

// bitsandbytes' _get_4bit_quantize_bounds: the table's order (a stable argsort, as torch's CPU sort
// is) and the midpoints of the sorted values, (a + b) / 2 in float32.
std::pair<at::Tensor, at::Tensor> bounds_and_order(FourBitType t, const at::Device& device) {
  const float* code = four_bit_code(t);
  std::array<int64_t, 16> order{};
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return code[a] < code[b]; });
  const auto ord = at::from_blob(order.data(), {16}, at::kLong).clone();
  const auto sorted = code_tensor(t, at::kCPU).index_select(0, ord);
  const auto mid = (sorted.slice(0, 0, 15) + sorted.slice(0, 1, 16)) / 2;
  return {mid.to(device), ord.to(device)};
}

void check_dtype(at::ScalarType d, const char* what) {
  if (d != at::kFloat && d != at::kBFloat16 && d != at::kHalf)
    fail(what, ": 4-bit quantization takes float32, bfloat16 or float16, got ", c10::toString(d));
}

}  // namespace

FourBitType parse_four_bit_type(const std::string& name) {
  if (name == "nf4") return FourBitType::NF4;
  if (name == "fp4") return FourBitType::FP4;
  fail("quantization.bnb_4bit_quant_type must be \"nf4\" or \"fp4\", got \"", name, "\"");
}

const char* four_bit_type_name(FourBitType t) { return t == FourBitType::NF4 ? "nf4" : "fp4"; }

const float* four_bit_code(FourBitType t) { return t == FourBitType::NF4 ? kNf4.data() : kFp4.data(); }

int64_t FourBit::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t FourBit::bytes() const {
  int64_t b = packed.numel() * packed.element_size() + absmax.numel() * absmax.element_size();
  if (double_quant) b += absmax2.numel() * absmax2.element_size() + static_cast<int64_t>(sizeof offset);
  return b;
}

int64_t four_bit_bytes(int64_t n, bool double_quant) {
  const int64_t blocks = (n + kFourBitBlock - 1) / kFourBitBlock;
  const int64_t codes = (n + 1) / 2;
  if (!double_quant) return codes + 4 * blocks;
  return codes + blocks + 4 * ((blocks + kNestedBlock - 1) / kNestedBlock) + 4;
}

FourBit quantize_4bit(const at::Tensor& weight, FourBitType type, bool double_quant) {
  check_dtype(weight.scalar_type(), "quantize_4bit");
  FourBit q;
  q.type = type;
  q.double_quant = double_quant;
  q.shape = weight.sizes().vec();
  q.dtype = weight.scalar_type();
  const auto flat = weight.reshape({-1}).to(at::kFloat);
  const int64_t n = flat.numel(), rem = n % kFourBitBlock, full = n - rem, blocks = full / kFourBitBlock;
  const auto com = flat.slice(0, 0, full).reshape({blocks, kFourBitBlock});
  auto absmax = std::get<0>(com.abs().max(-1));
  auto scaled = at::clamp(com * absmax.clamp_min(1e-38).reciprocal().view({-1, 1}), -1, 1).reshape({-1});
  if (rem) {
    const auto tail = flat.slice(0, full, n);
    const auto am = tail.abs().max().clamp_min(1e-38);
    absmax = at::cat({absmax, am.unsqueeze(0)});
    scaled = at::cat({scaled, at::clamp(tail / am, -1, 1)});
  }
  if (scaled.numel() % 2) scaled = at::constant_pad_nd(scaled, {0, 1});
  const auto [bounds, order] = bounds_and_order(type, scaled.device());
  auto codes = at::bucketize(scaled, bounds, /*out_int32=*/true, /*right=*/false);
  if (type != FourBitType::NF4) codes = order.index_select(0, codes.to(at::kLong));
  const auto c8 = codes.to(at::kByte);
  q.packed = at::bitwise_or(at::bitwise_left_shift(c8.slice(0, 0, c8.numel(), 2), 4), c8.slice(0, 1, c8.numel(), 2));
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  const auto offset = absmax.mean();
  auto [qabsmax, absmax2] = quantize_blockwise_cpu(absmax - offset, kNestedBlock);
  q.offset = offset.item<float>();
  q.absmax = qabsmax.to(weight.device());
  q.absmax2 = absmax2.to(weight.device());
  return q;
}

at::Tensor absmax_f32(const FourBit& q) {
  if (!q.double_quant) return q.absmax;
  return dequantize_blockwise(q.absmax, q.absmax2, kNestedBlock) + q.offset;
}

at::Tensor dequantize_4bit(const FourBit& q, at::ScalarType dtype) {
  check_dtype(dtype, "dequantize_4bit");
  const int64_t n = q.numel();
  const int64_t blocks = (n + kFourBitBlock - 1) / kFourBitBlock;
  const auto absmax = absmax_f32(q);
  if (q.packed.numel() != (n + 1) / 2 || absmax.numel() != blocks)
    fail("dequantize_4bit: ", q.packed.numel(), " code bytes and ", absmax.numel(), " absmax values for ", n,
         " elements");
  if (q.packed.device().is_cpu()) {
    // The same products in one pass (a quarter of the ATen path's time on a 134M model).
    const auto table = dequantize_table(q);
    const float* code = table.data_ptr<float>();
    const auto packed = q.packed.contiguous();
    const auto scale = absmax.to(at::kFloat).contiguous();
    auto out = at::empty({n}, at::kFloat);
    const uint8_t* p = packed.data_ptr<uint8_t>();
    const float* a = scale.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0 * kFourBitBlock, end = std::min(n, b1 * kFourBitBlock); i < end; ++i)
        o[i] = code[(i & 1) ? (p[i >> 1] & 0xF) : (p[i >> 1] >> 4)] * a[i / kFourBitBlock];
    });
    return out.reshape(q.shape).to(dtype);
  }
  const auto hi = at::bitwise_right_shift(q.packed, 4);
  const auto lo = at::bitwise_and(q.packed, 0xF);
  const auto idx = at::stack({hi, lo}, 1).reshape({-1}).to(at::kLong);
  auto values = dequantize_table(q).index_select(0, idx);
  if (values.numel() < blocks * kFourBitBlock) values = at::constant_pad_nd(values, {0, blocks * kFourBitBlock - values.numel()});
  values = (values.slice(0, 0, blocks * kFourBitBlock).view({blocks, kFourBitBlock}) * absmax.view({-1, 1})).reshape({-1});
  return values.slice(0, 0, n).reshape(q.shape).to(dtype);
}

}  // namespace shardlm::model::quant
