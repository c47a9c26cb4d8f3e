// QLoRA's 4-bit storage (model/quant/four_bit.h) against bitsandbytes itself: the golden of
// tests/reference/make_4bit_golden.py holds the pinned bitsandbytes' CPU quantize_4bit and
// dequantize_4bit of float32, bfloat16 and float16 inputs (odd sizes, blocks of zeros, tiny values of
// both signs, more than 256 blocks), NF4 and FP4, with and without double quantization. Every
// comparison is of bytes or bit patterns: codes, absmax, the nested absmax and offset, and the
// dequantized values.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "io/safetensors.h"
#include "model/quant/dynamic_map.h"
#include "model/quant/four_bit.h"
#include "util/error.h"

using namespace shardlm;
using model::quant::FourBitType;

namespace {

const std::map<std::string, at::Tensor>& golden() {
  static const auto g = [] {
    std::map<std::string, at::Tensor> m;
    for (auto& [k, t] : io::load_safetensors(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/4bit.safetensors"))
      m[k] = t;
    return m;
  }();
  return g;
}

const at::Tensor& G(const std::string& name) {
  const auto it = golden().find(name);
  if (it == golden().end()) throw std::runtime_error("tests/golden/4bit.safetensors has no " + name);
  return it->second;
}

// Equal bit patterns (so -0 differs from +0, and a NaN fails), with the first difference named.
::testing::AssertionResult SameBits(const at::Tensor& got, const at::Tensor& want) {
  if (got.scalar_type() != want.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << got.scalar_type() << " vs " << want.scalar_type();
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.numel();
  const auto a = got.contiguous().view({-1}), b = want.contiguous().view({-1});
  const int64_t es = a.element_size();
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::memcmp(pa + i * es, pb + i * es, es) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i].item<double>() << " vs "
                                           << b[i].item<double>();
  return ::testing::AssertionSuccess();
}

const char* kCases[] = {"f32", "bf16", "f16", "big"};
const char* kTypes[] = {"nf4", "fp4"};

}  // namespace

TEST(FourBit, DynamicMapIsBitsandbytes) {
  const auto map = at::from_blob(const_cast<float*>(model::quant::dynamic_map(true).data()), {256}, at::kFloat);
  EXPECT_TRUE(SameBits(map, G("map.dynamic")));
}

TEST(FourBit, CodesAndAbsmaxAreBitsandbytes) {
  for (const char* c : kCases)
    for (const char* t : kTypes) {
      SCOPED_TRACE(std::string(c) + "." + t);
      const auto q = model::quant::quantize_4bit(G(std::string("in.") + c), model::quant::parse_four_bit_type(t), false);
      const std::string k = std::string(c) + "." + t;
      EXPECT_TRUE(SameBits(q.packed, G(k + ".packed")));
      EXPECT_TRUE(SameBits(q.absmax, G(k + ".absmax")));
    }
}

TEST(FourBit, DequantizedValuesAreBitsandbytes) {
  for (const char* c : kCases)
    for (const char* t : kTypes) {
      SCOPED_TRACE(std::string(c) + "." + t);
      const auto& x = G(std::string("in.") + c);
      const auto q = model::quant::quantize_4bit(x, model::quant::parse_four_bit_type(t), false);
      const std::string k = std::string(c) + "." + t;
      const auto deq = model::quant::dequantize_4bit(q, x.scalar_type());
      EXPECT_EQ(deq.sizes(), x.sizes());
      EXPECT_TRUE(SameBits(deq, G(k + ".deq")));
      if (golden().count(k + ".deq32")) {
        EXPECT_TRUE(SameBits(model::quant::dequantize_4bit(q, at::kFloat), G(k + ".deq32")));
      }
    }
}

TEST(FourBit, DoubleQuantizationIsBitsandbytes) {
  for (const char* c : kCases)
    for (const char* t : kTypes) {
      SCOPED_TRACE(std::string(c) + "." + t);
      const auto& x = G(std::string("in.") + c);
      const auto q = model::quant::quantize_4bit(x, model::quant::parse_four_bit_type(t), true);
      const std::string k = std::string(c) + "." + t;
      EXPECT_TRUE(SameBits(q.packed, G(k + ".packed")));
      EXPECT_TRUE(SameBits(q.absmax, G(k + ".dq.absmax")));
      EXPECT_TRUE(SameBits(q.absmax2, G(k + ".dq.absmax2")));
      EXPECT_TRUE(SameBits(at::full({1}, q.offset, at::kFloat), G(k + ".dq.offset")));
      EXPECT_TRUE(SameBits(model::quant::dequantize_4bit(q, x.scalar_type()), G(k + ".dq.deq")));
    }
}

TEST(FourBit, GoldenCoversTheEdgeCases) {
  // The cases the golden promises: a zero block (absmax 0), a partial zero block (clamped to 1e-38),
  // both of FP4's zero codes, and two blocks of nested absmax values.
  EXPECT_EQ(G("f32.nf4.absmax")[1].item<float>(), 0.0f);
  EXPECT_EQ(G("f16.nf4.absmax")[2].item<float>(), 1e-38f);
  const auto fp4 = G("f32.fp4.packed");
  const int first = fp4[1].item<uint8_t>() & 0xF, second = fp4[2].item<uint8_t>() >> 4;  // elements 3, 4
  EXPECT_EQ(first, 8);   // +1e-4 · absmax: FP4's -0
  EXPECT_EQ(second, 0);  // -1e-4 · absmax: FP4's +0
  EXPECT_EQ(G("big.nf4.dq.absmax2").numel(), 2);
}

TEST(FourBit, StoredBytesAreTheFormula) {
  for (bool dq : {false, true}) {
    const auto q = model::quant::quantize_4bit(G("in.big"), FourBitType::NF4, dq);
    EXPECT_EQ(q.bytes(), model::quant::four_bit_bytes(q.numel(), dq));
  }
  const int64_t n = 4096 * 4096;
  EXPECT_DOUBLE_EQ(model::quant::four_bit_bytes(n, false) / (2.0 * n), 0.28125);
  EXPECT_NEAR(model::quant::four_bit_bytes(n, true) / (2.0 * n), 0.2579, 1e-4);
}

TEST(FourBit, RefusesOtherDtypesAndTypes) {
  EXPECT_THROW(model::quant::quantize_4bit(at::zeros({64}, at::kDouble), FourBitType::NF4, false), Error);
  EXPECT_THROW(model::quant::parse_four_bit_type("int4"), Error);
}
