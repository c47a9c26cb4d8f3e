// Compact optimizer states (optimizer.state_precision, optim/quantized_state.h) against the golden
// of tests/reference/make_adamw8bit_golden.py: bitsandbytes' dynamic maps, an independent numpy
// reference of AdamW8bit's block-wise update (bit for bit), bitsandbytes' own CPU AdamW8bit (to the
// distance the reference itself has from it), bf16 moments, and the fp32 fallback for small tensors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/quantized_state.h"
#include "util/error.h"

using namespace shardlm;

namespace {

std::map<std::string, at::Tensor> adamw8bit_golden() {
  std::map<std::string, at::Tensor> g;
  for (auto& [k, t] : io::load_safetensors(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/adamw8bit.safetensors"))
    g[k] = t;
  return g;
}

const char* kAdamw8bitNames[] = {"w", "u", "b"};
const bool kAdamw8bitDecay[] = {true, false, true};  // make_adamw8bit_golden.py SHAPES

struct Run {
  std::map<std::string, at::Tensor> params, grads;
  std::unique_ptr<optim::AdamW> opt;
};

Run make_run(const std::map<std::string, at::Tensor>& g, optim::StatePrecision precision) {
  Run r;
  std::vector<optim::Segment> segs;
  for (int k = 0; k < 3; ++k) {
    const std::string n = kAdamw8bitNames[k];
    r.params[n] = g.at("init." + n).clone();
    r.grads[n] = at::zeros_like(r.params[n]);
    segs.push_back({n, r.params[n], r.grads[n], kAdamw8bitDecay[k]});
  }
  optim::AdamWOptions o{1e-2, 0.9, 0.95, 1e-8, 0.1};
  o.state_precision = precision;
  r.opt = std::make_unique<optim::AdamW>(std::move(segs), o);
  return r;
}

void set_grads(Run& r, const std::map<std::string, at::Tensor>& g, int t) {
  for (const char* n : kAdamw8bitNames) r.grads[n].copy_(g.at("grad." + std::to_string(t) + "." + n));
}

double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

TEST(CompactStates, DynamicMapsAreBitsandbytes) {
  const auto g = adamw8bit_golden();
  for (bool s : {true, false}) {
    const auto& m = optim::dynamic_map(s);
    const auto expect = g.at(s ? "map.signed" : "map.unsigned");
    ASSERT_EQ(expect.numel(), 256);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(m[i], expect[i].item<float>()) << (s ? "signed" : "unsigned") << " code " << i;
  }
}

TEST(CompactStates, QuantizeIsNearestCodePerBlockFromTheParametersElementZero) {
  at::manual_seed(3);
  const auto x = at::randn({1000}) * at::exp(at::randn({1000}));
  auto [codes, absmax] = optim::quantize_blockwise(x, true);
  ASSERT_EQ(absmax.numel(), 4);  // 256, 256, 256, 232
  const auto map = at::from_blob(const_cast<float*>(optim::dynamic_map(true).data()), {256}, at::kFloat);
  for (int64_t b = 0; b < 4; ++b) {
    const auto blk = x.slice(0, b * 256, std::min<int64_t>(1000, (b + 1) * 256));
    EXPECT_EQ(absmax[b].item<float>(), blk.abs().max().item<float>());
    const auto normed = blk / absmax[b];
    const auto nearest = (normed.unsqueeze(1) - map.unsqueeze(0)).abs().argmin(1);
    const auto got = codes.slice(0, b * 256, b * 256 + blk.numel()).to(at::kLong);
    // Equal except where two codes are equally near (none in random data), and the sign rule.
    const auto differ = (got != nearest).sum().item<int64_t>();
    EXPECT_EQ(differ, 0) << "block " << b;
  }
  // Dequantized values are within half a code step of the input.
  const auto back = optim::dequantize_blockwise(codes, absmax, true);
  EXPECT_LT(((back - x).abs() / x.abs().max()).max().item<double>(), 0.02);
  // A slice that starts at element 300 of the parameter: blocks still start at multiples of 256, so
  // the block fully inside it (256..511 -> its elements 0..211 belong to block 1 partly) ...
  auto [c2, a2] = optim::quantize_blockwise(x.slice(0, 300, 1000), true, 300);
  EXPECT_EQ(a2.numel(), 3);  // blocks 1 (partly), 2, 3
  EXPECT_TRUE(at::equal(c2.slice(0, 212, 700), codes.slice(0, 512, 1000)));  // whole blocks 2, 3 agree
  EXPECT_TRUE(at::equal(a2.slice(0, 1, 3), absmax.slice(0, 2, 4)));
}

TEST(CompactStates, EightBitMatchesTheReferenceBitForBitAndBitsandbytesToItsDistance) {
  const auto g = adamw8bit_golden();
  auto r = make_run(g, optim::StatePrecision::Int8);
  EXPECT_EQ(r.opt->format(0), optim::StatePrecision::Int8);
  EXPECT_EQ(r.opt->format(1), optim::StatePrecision::Int8);
  EXPECT_EQ(r.opt->format(2), optim::StatePrecision::FP32);  // 100 elements < min_8bit_size 4096
  EXPECT_EQ(r.opt->exp_avg(0).scalar_type(), at::kByte);
  EXPECT_EQ(r.opt->exp_avg(2).scalar_type(), at::kFloat);
  EXPECT_EQ(r.opt->absmax(1, false).numel(), 21);  // 5200 elements: 20 whole blocks and a partial one
  // Moment bytes: 2 per element + 2 absmax floats per block for the 8-bit ones, 8 per element else.
  EXPECT_EQ(r.opt->state_bytes(), 2 * 6144 + 8 * 24 + 2 * 5200 + 8 * 21 + 8 * 100);
  for (int t = 1; t <= 5; ++t) {
    set_grads(r, g, t);
    r.opt->step(1e-2);
    for (int k = 0; k < 3; ++k) {
      const std::string n = kAdamw8bitNames[k], s = std::to_string(t) + "." + n;
      const auto& p = r.params[n];
      const auto ref = g.at("8bit.after." + s), bnb = g.at("bnb.after." + s);
      const auto init = g.at("init." + n);
      if (k < 2) {
        EXPECT_TRUE(at::equal(p, ref)) << n << " step " << t << " max diff " << max_abs(p - ref);
        EXPECT_TRUE(at::equal(r.opt->exp_avg(k).view({-1}), g.at("8bit.codes1." + s))) << n << " step " << t;
        EXPECT_TRUE(at::equal(r.opt->exp_avg_sq(k).view({-1}), g.at("8bit.codes2." + s))) << n << " step " << t;
        EXPECT_TRUE(at::equal(r.opt->absmax(k, false), g.at("8bit.absmax1." + s))) << n << " step " << t;
        EXPECT_TRUE(at::equal(r.opt->absmax(k, true), g.at("8bit.absmax2." + s))) << n << " step " << t;
      } else {  // fp32 moments through torch's _foreach ops: float32 rounding of the same arithmetic
        EXPECT_LE(max_abs(p - ref), 1e-6 * max_abs(ref)) << n << " step " << t;
      }
      // bitsandbytes' CPU backend picks codes by table lookup (see the generator): this run is no
      // farther from it than the reference is (plus float32 noise).
      const double moved = max_abs(ref - init);
      EXPECT_LE(max_abs(p - bnb) / moved, max_abs(ref - bnb) / moved + 1e-5) << n << " step " << t;
    }
  }
  // After the first step bitsandbytes and the reference agree to float32 noise (same codes are not
  // yet read back): the update arithmetic is bitsandbytes'.
}

TEST(CompactStates, EightBitFirstStepEqualsBitsandbytes) {
  const auto g = adamw8bit_golden();
  auto r = make_run(g, optim::StatePrecision::Int8);
  set_grads(r, g, 1);
  r.opt->step(1e-2);
  for (const char* n : kAdamw8bitNames) {
    const auto bnb = g.at(std::string("bnb.after.1.") + n), init = g.at(std::string("init.") + n);
    EXPECT_LE(max_abs(r.params[n] - bnb), 1e-5 * max_abs(bnb - init)) << n;
  }
}

TEST(CompactStates, Bf16MomentsMatchTheReference) {
  const auto g = adamw8bit_golden();
  auto r = make_run(g, optim::StatePrecision::BF16);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(r.opt->exp_avg(k).scalar_type(), at::kBFloat16);
  EXPECT_EQ(r.opt->state_bytes(), 4 * (6144 + 5200 + 100));
  for (int t = 1; t <= 5; ++t) {
    set_grads(r, g, t);
    r.opt->step(1e-2);
    for (int k = 0; k < 3; ++k) {
      const std::string n = kAdamw8bitNames[k], s = std::to_string(t) + "." + n;
      EXPECT_TRUE(at::equal(r.params[n], g.at("bf16.after." + s))) << n << " step " << t;
      EXPECT_TRUE(at::equal(r.opt->exp_avg(k).to(at::kFloat).view({-1}), g.at("bf16.exp_avg." + s))) << n << " step " << t;
    }
  }
  // bf16 moments stay close to fp32 AdamW's trajectory.
  const auto ref32 = g.at("fp32.after.5.w"), init = g.at("init.w");
  EXPECT_LE(max_abs(r.params["w"] - ref32), 0.02 * max_abs(ref32 - init));
}

TEST(CompactStates, RefusesLambAndKeepsStateThroughStateAndLoadState) {
  auto p = at::ones({8}), gr = at::zeros({8});
  optim::AdamWOptions lamb;
  lamb.rule = optim::UpdateRule::Lamb;
  lamb.state_precision = optim::StatePrecision::Int8;
  EXPECT_THROW(optim::AdamW({{"p", p, gr, true}}, lamb), Error);

  const auto g = adamw8bit_golden();
  auto a = make_run(g, optim::StatePrecision::Int8);
  set_grads(a, g, 1);
  a.opt->step(1e-2);
  std::map<std::string, at::Tensor> saved;
  for (auto& [k, t] : a.opt->state()) saved[k] = t.clone();
  EXPECT_EQ(saved.count("w.exp_avg.absmax"), 1u);
  auto b = make_run(g, optim::StatePrecision::Int8);
  for (const char* n : kAdamw8bitNames) b.params[n].copy_(a.params[n]);
  b.opt->load_state(saved, 1);
  for (int t = 2; t <= 3; ++t) {
    set_grads(a, g, t);
    set_grads(b, g, t);
    a.opt->step(1e-2);
    b.opt->step(1e-2);
  }
  for (const char* n : kAdamw8bitNames) EXPECT_TRUE(at::equal(a.params[n], b.params[n])) << n;
  auto c = make_run(g, optim::StatePrecision::FP32);  // fp32 moments cannot take 8-bit codes
  EXPECT_THROW(c.opt->load_state(saved, 1), Error);
}

// exp_avg's sign rule (kernels.cu): a value whose nearest code is 0 keeps its sign; exp_avg_sq's
// unsigned map has no such rule; a zero block (absmax 0) stores the code of 0.
TEST(CompactStates, SignRuleAndZeroBlocks) {
  const optim::Quantizer s(true), u(false);
  EXPECT_LT(s.dequantize(s.quantize(-1e-9f, 1.0f), 1.0f), 0.0f);
  EXPECT_EQ(s.dequantize(s.quantize(1e-9f, 1.0f), 1.0f), 0.0f);
  EXPECT_EQ(u.dequantize(u.quantize(1e-9f, 1.0f), 1.0f), 0.0f);
  EXPECT_EQ(s.dequantize(s.quantize(0.0f, 0.0f), 0.0f), 0.0f);
  EXPECT_EQ(s.dequantize(s.quantize(-1.0f, 1.0f), 1.0f), optim::dynamic_map(true)[0]);  // -1 is not a code
  EXPECT_EQ(s.dequantize(s.quantize(1.0f, 1.0f), 1.0f), 1.0f);
}

// The quantizer's fast start (a table by the float's top 16 bits) gives exactly the binary search's
// nearest code, on values spread over every exponent and sign, and at the midpoints themselves.
TEST(CompactStates, FastNearestCodeEqualsBinarySearch) {
  for (bool is_signed : {true, false}) {
    const optim::Quantizer q(is_signed);
    const auto mid = optim::Quantizer::midpoints(is_signed);
    auto check = [&](float x) {
      int c = static_cast<int>(std::lower_bound(mid.begin(), mid.end(), x) - mid.begin());
      const auto& map = optim::dynamic_map(is_signed);
      if (is_signed && std::signbit(map[c]) != std::signbit(x)) c += x > 0.0f ? 1 : -1;
      ASSERT_EQ(q.quantize(x, 1.0f), c) << x;
    };
    at::manual_seed(5);
    const auto xs = (at::rand({200000}) * 2 - 1) * at::pow(10.0, at::rand({200000}) * -12);
    const float* x = xs.data_ptr<float>();
    for (int64_t i = 0; i < xs.numel(); ++i) check(x[i]);
    for (float m : mid) {
      check(m);
      check(std::nextafter(m, 2.0f));
      check(std::nextafter(m, -2.0f));
    }
  }
}
