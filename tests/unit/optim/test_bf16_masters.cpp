// bf16 master weights (optimizer.master_precision "bf16", optim/master_format.h) against the golden of
// tests/reference/make_bf16_master_golden.py, bit for bit over six steps: torchdistx's Kahan summation
// (fp32 and bf16 moments), torchao's stochastic rounding with the Philox stream, and round to nearest.
// Also: the generator's known answers, the stream of a segment cut in two (as ZeRO cuts parameters)
// equals the whole parameter's, Kahan stays closer to fp32 masters than rounding to nearest, and the
// combinations not built are refused.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/master_format.h"
#include "util/error.h"

using namespace shardlm;

namespace {

std::map<std::string, at::Tensor> golden() {
  std::map<std::string, at::Tensor> g;
  for (auto& [k, t] : io::load_safetensors(std::string(SHARDLM_SOURCE_DIR) + "/tests/golden/bf16_masters.safetensors"))
    g[k] = t;
  return g;
}

const char* kNames[] = {"w", "b"};
const bool kDecay[] = {true, false};  // make_bf16_master_golden.py SHAPES
constexpr int kSteps = 6;

optim::AdamWOptions options(optim::MasterRounding rounding, optim::StatePrecision moments) {
  optim::AdamWOptions o{1e-3, 0.9, 0.95, 1e-8, 0.1};
  o.masters = rounding;
  o.state_precision = moments;
  o.seed = 1234;
  return o;
}

// The two parameters, each as one segment or (cut) as two, as ZeRO hands a parameter to two ranks.
struct MasterRun {
  std::map<std::string, at::Tensor> params, grads;
  std::unique_ptr<optim::AdamW> opt;
  MasterRun(const std::map<std::string, at::Tensor>& g, optim::AdamWOptions o, bool cut) {
    std::vector<optim::Segment> segs;
    for (int k = 0; k < 2; ++k) {
      const std::string n = kNames[k];
      params[n] = g.at("init." + n).clone();
      grads[n] = at::zeros(params[n].sizes(), at::kFloat);
      const int64_t numel = params[n].numel(), at_ = cut ? numel / 3 + 1 : numel;
      for (int64_t lo : {int64_t{0}, at_}) {
        const int64_t hi = lo == 0 ? at_ : numel;
        if (lo >= hi) continue;
        segs.push_back({n + "@" + std::to_string(lo), params[n].view({-1}).narrow(0, lo, hi - lo),
                        grads[n].view({-1}).narrow(0, lo, hi - lo), kDecay[k], lo, numel, lo});
      }
    }
    opt = std::make_unique<optim::AdamW>(std::move(segs), o);
  }
  void step(const std::map<std::string, at::Tensor>& g, int t) {
    for (const char* n : kNames) grads[n].copy_(g.at("grad." + std::to_string(t) + "." + n));
    opt->step(1e-3);
  }
  at::Tensor compensation(const std::string& n) const {  // the segments' buffers, joined
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < opt->segments().size(); ++i)
      if (opt->segments()[i].name.rfind(n + "@", 0) == 0) parts.push_back(opt->compensation(i));
    return at::cat(parts).view(params.at(n).sizes());
  }
};

void expect_golden(optim::MasterRounding rounding, optim::StatePrecision moments, const std::string& tag, bool cut) {
  const auto g = golden();
  MasterRun run(g, options(rounding, moments), cut);
  for (int t = 1; t <= kSteps; ++t) {
    run.step(g, t);
    for (const char* n : kNames) {
      const auto key = tag + ".after." + std::to_string(t) + "." + n;
      ASSERT_EQ(run.params[n].scalar_type(), at::kBFloat16);
      EXPECT_TRUE(at::equal(run.params[n], g.at(key)))
          << key << ": " << (run.params[n].ne(g.at(key))).sum().item<int64_t>() << " elements differ";
      if (rounding == optim::MasterRounding::Kahan) {
        const auto ckey = tag + ".compensation." + std::to_string(t) + "." + n;
        EXPECT_TRUE(at::equal(run.compensation(n), g.at(ckey))) << ckey;
      }
    }
  }
}

}  // namespace

TEST(Bf16Masters, PhiloxKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  EXPECT_EQ(optim::philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627E8D5u, 0xE169C58Du, 0xBC57AC4Cu, 0x9B00DBD8u}));
  EXPECT_EQ(optim::philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (std::array<uint32_t, 4>{0x408F276Du, 0x41C83B0Eu, 0xA20BC7C6u, 0x6D5451FDu}));
  EXPECT_EQ(optim::philox4x32_10({0x243F6A88u, 0x85A308D3u, 0x13198A2Eu, 0x03707344u}, {0xA4093822u, 0x299F31D0u}),
            (std::array<uint32_t, 4>{0xD16CFE09u, 0x94FDCCEBu, 0x5001E420u, 0x24126EA1u}));
}

TEST(Bf16Masters, RandomBitsEqualTheReferenceStream) {
  const auto g = golden();
  for (const char* n : kNames) {
    const auto expect = g.at(std::string("random.1.") + n);
    const int32_t* e = expect.data_ptr<int32_t>();
    for (int64_t j = 0; j < expect.numel(); ++j)
      ASSERT_EQ(optim::stochastic_bits(1234, 1, optim::fnv1a32(n), j), e[j]) << n << " element " << j;
  }
}

TEST(Bf16Masters, StochasticRoundingIsTorchaos) {
  // Away from zero iff r < the low 16 bits; exact values and the carry into the exponent.
  const float x = 1.0f + 0x1.8p-9f;  // low 16 bits 0x4000... of 1.00292969: between bf16 1 and 1 + 2^-7
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint16_t low = bits & 0xFFFF;
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(x, low - 1)), 1.0f + 0x1p-7f);
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(x, low)), 1.0f);
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(-x, 0)), -(1.0f + 0x1p-7f));
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(1.5f, 0)), 1.5f);  // exact in bf16: never moves
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(1.5f, 0xFFFF)), 1.5f);
  EXPECT_EQ(static_cast<float>(optim::round_stochastic(0x1.FFFFFEp0f, 0)), 2.0f);  // carries into the exponent
}

TEST(Bf16Masters, KahanWithFp32MomentsIsAnyPrecisionAdamW) {
  expect_golden(optim::MasterRounding::Kahan, optim::StatePrecision::FP32, "kahan.fp32", false);
}
TEST(Bf16Masters, KahanWithBf16Moments) {
  expect_golden(optim::MasterRounding::Kahan, optim::StatePrecision::BF16, "kahan.bf16", false);
}
TEST(Bf16Masters, StochasticIsTorchaosRoundingOnThePhiloxStream) {
  expect_golden(optim::MasterRounding::Stochastic, optim::StatePrecision::FP32, "stochastic.fp32", false);
}
TEST(Bf16Masters, Nearest) {
  expect_golden(optim::MasterRounding::Nearest, optim::StatePrecision::FP32, "nearest.fp32", false);
}
// Cut into two segments (element offsets as a ZeRO shard boundary gives them): the same bits.
TEST(Bf16Masters, SegmentsCutLikeZeroShardsStepAsTheWholeParameter) {
  expect_golden(optim::MasterRounding::Stochastic, optim::StatePrecision::FP32, "stochastic.fp32", true);
  expect_golden(optim::MasterRounding::Kahan, optim::StatePrecision::FP32, "kahan.fp32", true);
}

// The point of the compensation: the undecayed parameter follows fp32 masters far more closely than
// rounding to nearest does (where updates under half a bf16 ulp are lost).
TEST(Bf16Masters, KahanTracksFp32MastersWhereNearestDrifts) {
  const auto g = golden();
  const auto init = g.at("init.b").to(at::kFloat), mixed = g.at("mixed.fp32.after.6.b");
  auto distance = [&](const at::Tensor& t) { return ((t.to(at::kFloat) - mixed).norm() / (mixed - init).norm()).item<double>(); };
  MasterRun kahan(g, options(optim::MasterRounding::Kahan, optim::StatePrecision::FP32), false);
  MasterRun nearest(g, options(optim::MasterRounding::Nearest, optim::StatePrecision::FP32), false);
  for (int t = 1; t <= kSteps; ++t) kahan.step(g, t), nearest.step(g, t);
  const double k = distance(kahan.params["b"].to(at::kFloat) + kahan.compensation("b").to(at::kFloat));
  const double n = distance(nearest.params["b"]);
  std::printf("[ bf16     ] ||p - p_fp32|| / ||p_fp32 - p0|| after 6 steps: kahan (p + c) %.4f, nearest %.4f\n", k, n);
  EXPECT_LT(k, 0.01);
  EXPECT_GT(n, 0.3);
}

TEST(Bf16Masters, RefusesWhatIsNotBuilt) {
  auto p = at::zeros({8}, at::kBFloat16), g = at::zeros({8}, at::kFloat);
  auto lamb = options(optim::MasterRounding::Kahan, optim::StatePrecision::FP32);
  lamb.rule = optim::UpdateRule::Lamb;
  EXPECT_THROW(optim::AdamW({{"p", p, g}}, lamb), Error);
  auto p32 = at::zeros({8}, at::kFloat);
  try {
    optim::AdamW({{"p", p32, g}}, options(optim::MasterRounding::Stochastic, optim::StatePrecision::FP32));
    FAIL() << "fp32 masters accepted as bf16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.master_precision"), std::string::npos) << e.what();
  }
  EXPECT_THROW(optim::parse_master_format("fp16", "kahan"), Error);
  EXPECT_THROW(optim::parse_master_format("bf16", "truncate"), Error);
  EXPECT_EQ(optim::parse_master_format("fp32", "stochastic"), optim::MasterRounding::None);
}
