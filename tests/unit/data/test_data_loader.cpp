// DataLoader: the run's data order is llm.c's, as a pure function of the global sample index
// k = micro-step x ranks + rank (past a wrap of the file too), so that an outside reference can replay it,
// N ranks see exactly what one rank with N times the micro-batch would before the first wrap, and
// any number of ranks reads the same samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "data/loader/data_loader.h"
#include "test_helpers.h"

using namespace shardlm::data;
using namespace shardlm::data::testing;

TEST(DataLoader, StepsPerPassIsFloorOfLenMinusOneOverGlobalWindow) {
  // N=2, B=2, T=3: one global micro-step spans 12 tokens and needs 13.
  EXPECT_EQ(DataLoader(iota_tokens(13), 2, 3, 0, 2).micro_steps_per_pass(), 1);
  EXPECT_EQ(DataLoader(iota_tokens(24), 2, 3, 0, 2).micro_steps_per_pass(), 1);
  EXPECT_EQ(DataLoader(iota_tokens(25), 2, 3, 0, 2).micro_steps_per_pass(), 2);
  EXPECT_EQ(DataLoader(iota_tokens(40), 2, 3, 1, 2).micro_steps_per_pass(), 3);
}

TEST(DataLoader, WindowStartFollowsTheFormulaAndWraps) {
  // len 40, N=2, B=2, T=3: W=6, 39/6 = 6 windows, E=(40-1)/12=3, so micro-step 3 is the first to wrap.
  const auto tokens = iota_tokens(40);
  const DataLoader r0(tokens, 2, 3, 0, 2), r1(tokens, 2, 3, 1, 2);
  ASSERT_EQ(r0.micro_steps_per_pass(), 3);
  // Written out, not recomputed: ((2m + r) mod 6) * 6.
  const int64_t expect_r0[] = {0, 12, 24, 0, 12, 24, 0};
  const int64_t expect_r1[] = {6, 18, 30, 6, 18, 30, 6};
  for (int64_t m = 0; m < 7; ++m) {
    EXPECT_EQ(r0.window_start(m), expect_r0[m]) << "m=" << m;
    EXPECT_EQ(r1.window_start(m), expect_r1[m]) << "m=" << m;
  }
  EXPECT_EQ(r1.window_start(3000001), 18);  // 6000003 mod 6 = 3
  // len 45: 7 windows, but 3 micro-steps of 2 ranks per pass. The wrap follows the global sample:
  // samples 6, 7, 8, ... read windows 6, 0, 1, ..., not 0, 1, 2 (where rank 0 would restart the file).
  const DataLoader w0(iota_tokens(45), 2, 3, 0, 2), w1(iota_tokens(45), 2, 3, 1, 2);
  ASSERT_EQ(w0.micro_steps_per_pass(), 3);
  const int64_t expect_w0[] = {0, 12, 24, 36, 6, 18, 30, 0};
  const int64_t expect_w1[] = {6, 18, 30, 0, 12, 24, 36, 6};
  for (int64_t m = 0; m < 8; ++m) {
    EXPECT_EQ(w0.window_start(m), expect_w0[m]) << "m=" << m;
    EXPECT_EQ(w1.window_start(m), expect_w1[m]) << "m=" << m;
  }
}

// Global sample k reads the same window on 1, 2, 3, 4 or 8 data-parallel ranks, through several
// passes over files whose window count no rank count divides.
TEST(DataLoader, SampleKReadsTheSameWindowOnAnyNumberOfRanks) {
  for (int64_t len : {45, 61, 100}) {
    const auto tokens = iota_tokens(len);
    const int64_t S = (len - 1) / 6;
    for (int world : {1, 2, 3, 4, 8}) {
      if (world * 6 + 1 > len) continue;
      std::vector<DataLoader> ranks;
      for (int r = 0; r < world; ++r) ranks.emplace_back(tokens, 2, 3, r, world);
      for (int64_t k = 0; k < 5 * S; ++k)
        ASSERT_EQ(ranks[static_cast<size_t>(k % world)].window_start(k / world), (k % S) * 6)
            << "len " << len << ", " << world << " ranks, sample " << k;
    }
  }
}

TEST(DataLoader, WindowStartMatchesFormulaOverManyShapes) {
  for (int world : {1, 2, 3, 4, 8}) {
    for (int64_t B : {1, 2, 5}) {
      for (int64_t T : {1, 4, 7}) {
        const int64_t W = B * T;
        for (int64_t len : {world * W + 1, 3 * world * W + 5, 10 * world * W + world * W}) {
          const auto tokens = iota_tokens(len);
          for (int r = 0; r < world; ++r) {
            const DataLoader dl(tokens, B, T, r, world);
            const int64_t E = (len - 1) / (world * W);
            ASSERT_EQ(dl.micro_steps_per_pass(), E);
            for (int64_t m = 0; m < 3 * E + 2; ++m) {
              const int64_t start = dl.window_start(m);
              ASSERT_EQ(start, ((m * world + r) % ((len - 1) / W)) * W);
              if (m < E) {
                ASSERT_EQ(start, (m * world + r) * W) << "before the wrap: llm.c's order";
              }
              ASSERT_LE(start + W + 1, len) << "window runs past the end";
            }
          }
        }
      }
    }
  }
}

TEST(DataLoader, BatchHoldsTheWindowShiftedByOne) {
  const auto tokens = iota_tokens(40);
  const DataLoader dl(tokens, 2, 3, 1, 2);
  for (int64_t m : {0, 2, 3, 5}) {
    const auto b = dl.batch(m);
    ASSERT_EQ(b.inputs.scalar_type(), at::kLong);
    ASSERT_EQ(b.targets.scalar_type(), at::kLong);
    ASSERT_EQ(b.inputs.sizes(), (at::IntArrayRef{2, 3}));
    ASSERT_EQ(b.targets.sizes(), (at::IntArrayRef{2, 3}));
    ASSERT_TRUE(b.inputs.is_contiguous() && b.targets.is_contiguous());
    const int64_t start = dl.window_start(m);
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t t = 0; t < 3; ++t) {
        EXPECT_EQ(b.inputs[i][t].item<int64_t>(), start + i * 3 + t);
        EXPECT_EQ(b.targets[i][t].item<int64_t>(), start + i * 3 + t + 1);
      }
    }
  }
  // The last window of a pass ends on the last usable token, and the next step starts over.
  const DataLoader exact(iota_tokens(13), 2, 3, 1, 2);
  EXPECT_EQ(exact.batch(0).targets[1][2].item<int64_t>(), 12);
  EXPECT_EQ(exact.batch(1).inputs[0][0].item<int64_t>(), 6);
}

TEST(DataLoader, BatchWidensFullUint16Range) {
  auto v = std::make_shared<const Tokens>(std::vector<uint32_t>{65535, 32768, 0, 1, 65534});
  const auto b = DataLoader(v, 1, 4, 0, 1).batch(0);
  EXPECT_EQ(b.inputs[0][0].item<int64_t>(), 65535);
  EXPECT_EQ(b.inputs[0][1].item<int64_t>(), 32768);
  EXPECT_EQ(b.targets[0][3].item<int64_t>(), 65534);
}

// Llama-3's ids (128256 of them) and the largest uint32 reach the batch unchanged from both widths
// on disk: a 32-bit file read through its mapping and 16-bit ids beside them.
TEST(DataLoader, BatchWidens32BitIdsFromAFile) {
  TempDir dir;
  const std::vector<uint32_t> ids = {128255, 65536, 0, 4294967295u, 70000, 1};
  write_llmc_tokens(dir.file("w.bin"), ids, 32);
  const auto tokens = std::make_shared<const Tokens>(read_tokens(dir.file("w.bin"), TokenFormat::LlmcBin));
  const auto b = DataLoader(tokens, 1, 5, 0, 1).batch(0);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(b.inputs[0][i].item<int64_t>(), static_cast<int64_t>(ids[static_cast<size_t>(i)]));
    EXPECT_EQ(b.targets[0][i].item<int64_t>(), static_cast<int64_t>(ids[static_cast<size_t>(i) + 1]));
  }
  write_llmc_tokens(dir.file("n.bin"), {65535, 7, 256}, 16);
  const auto narrow = std::make_shared<const Tokens>(read_tokens(dir.file("n.bin"), TokenFormat::LlmcBin));
  const auto n = DataLoader(narrow, 1, 2, 0, 1).batch(0);
  EXPECT_EQ(n.inputs[0][0].item<int64_t>(), 65535);
  EXPECT_EQ(n.targets[0][1].item<int64_t>(), 256);
}

TEST(DataLoader, NRanksOfBEqualOneRankOfNTimesBBeforeTheWrap) {
  // 1000 tokens, B=2, T=4, N=3: E = 999/24 = 41 micro-steps before the first wrap. (Past it the
  // order wraps per window of B*T tokens, so a window of 3B*T wraps elsewhere.)
  const auto tokens = iota_tokens(1000);
  const int N = 3;
  const int64_t B = 2, T = 4;
  const DataLoader whole(tokens, N * B, T, 0, 1);
  for (int r = 0; r < N; ++r) {
    const DataLoader part(tokens, B, T, r, N);
    ASSERT_EQ(part.micro_steps_per_pass(), whole.micro_steps_per_pass());
    for (int64_t m = 0; m < part.micro_steps_per_pass(); ++m) {
      const auto p = part.batch(m);
      const auto w = whole.batch(m);
      ASSERT_TRUE(at::equal(p.inputs, w.inputs.slice(0, r * B, (r + 1) * B))) << "r=" << r << " m=" << m;
      ASSERT_TRUE(at::equal(p.targets, w.targets.slice(0, r * B, (r + 1) * B))) << "r=" << r << " m=" << m;
    }
  }
}

TEST(DataLoader, SharesTheTokenBuffer) {
  const auto tokens = iota_tokens(100);
  const DataLoader a(tokens, 2, 4, 0, 2), b(tokens, 2, 4, 1, 2);
  EXPECT_EQ(tokens.use_count(), 3);
  EXPECT_EQ(a.num_tokens(), 100);
}

TEST(DataLoaderErrors, TooFewTokensForOneStep) {
  // N=2, B=2, T=3 needs 13 tokens; 12 give E = 0.
  const std::string msg = error_message([] { DataLoader(iota_tokens(12), 2, 3, 0, 2); });
  EXPECT_TRUE(Contains(msg, "has 12 tokens"));
  EXPECT_TRUE(Contains(msg, "2 ranks x 2 x 3"));
  EXPECT_TRUE(Contains(msg, "13 tokens"));
  EXPECT_TRUE(Contains(msg, "use a smaller batch/seq_len or more data"));
  EXPECT_TRUE(Contains(error_message([] { DataLoader(iota_tokens(0), 1, 1, 0, 1); }), "has 0 tokens"));
}

TEST(DataLoaderErrors, BadShapesAndRanks) {
  const auto t = iota_tokens(100);
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(t, 0, 4, 0, 1); }), "at least 1"));
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(t, 2, -1, 0, 1); }), "at least 1"));
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(t, 2, 4, 2, 2); }), "out of range"));
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(t, 2, 4, -1, 2); }), "out of range"));
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(nullptr, 2, 4, 0, 1); }), "no token buffer"));
  EXPECT_TRUE(Contains(error_message([&] { DataLoader(t, 2, 4, 0, 1).window_start(-1); }), "negative"));
}

// Shuffled order (data_loader.h): 61 tokens, B=2, T=3 -> W = 6, N = 60 / 6 = 10 windows.
namespace {
std::vector<int64_t> shuffled_starts(int world, uint64_t seed, int64_t samples) {
  const auto tokens = iota_tokens(61);
  std::vector<DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(tokens, 2, 3, r, world, DataLoader::Order{true, seed});
  std::vector<int64_t> starts;
  for (int64_t k = 0; k < samples; ++k) starts.push_back(ranks[k % world].window_start(k / world));
  return starts;  // by global sample k = micro-step x world + rank
}
}  // namespace

TEST(DataLoaderShuffle, EveryWindowOncePerPassEachPassInANewOrder) {
  const std::vector<int64_t> starts = shuffled_starts(2, 1234, 30);  // three passes
  std::vector<int64_t> all_windows(10);
  for (int64_t i = 0; i < 10; ++i) all_windows[i] = 6 * i;
  std::vector<std::vector<int64_t>> passes;
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> pass(starts.begin() + 10 * e, starts.begin() + 10 * (e + 1));
    passes.push_back(pass);
    std::sort(pass.begin(), pass.end());
    EXPECT_EQ(pass, all_windows) << "pass " << e;
  }
  EXPECT_NE(passes[0], all_windows) << "the first pass is not shuffled";
  EXPECT_NE(passes[0], passes[1]);
  EXPECT_NE(passes[1], passes[2]);
}

TEST(DataLoaderShuffle, APureFunctionOfSeedAndSampleWhateverTheRanks) {
  // The same seed gives the same order; another seed another one.
  EXPECT_EQ(shuffled_starts(2, 7, 25), shuffled_starts(2, 7, 25));
  EXPECT_NE(shuffled_starts(2, 7, 25), shuffled_starts(2, 8, 25));
  // Sample k is the same window on 1, 2 or 5 data-parallel ranks (so a resume on fewer ranks with more
  // accumulation reads the same samples), and across pass boundaries that the ranks do not align with.
  EXPECT_EQ(shuffled_starts(1, 7, 25), shuffled_starts(2, 7, 25));
  EXPECT_EQ(shuffled_starts(1, 7, 25), shuffled_starts(5, 7, 25));
  // A loader asked out of order (a resume) gives what one read in order gives.
  const DataLoader dl(iota_tokens(61), 2, 3, 1, 2, DataLoader::Order{true, 7});
  const int64_t late = dl.window_start(13), early = dl.window_start(2);
  EXPECT_EQ(early, shuffled_starts(2, 7, 25)[2 * 2 + 1]);
  EXPECT_EQ(late, shuffled_starts(2, 7, 30)[13 * 2 + 1]);
  // The batch holds that window: inputs its first W tokens, targets shifted by one.
  const auto b = dl.batch(2);
  EXPECT_EQ(b.inputs.flatten()[0].item<int64_t>(), early);
  EXPECT_EQ(b.targets.flatten()[5].item<int64_t>(), early + 6);
}

TEST(DataLoaderShuffle, OffByDefaultAndTheUnshuffledOrderUnchanged) {
  const auto tokens = iota_tokens(61);
  const DataLoader plain(tokens, 2, 3, 1, 2), explicit_off(tokens, 2, 3, 1, 2, DataLoader::Order{false, 99});
  for (int64_t m = 0; m < 12; ++m) {
    EXPECT_EQ(plain.window_start(m), ((m * 2 + 1) % 10) * 6);
    EXPECT_EQ(explicit_off.window_start(m), plain.window_start(m));
  }
}

TEST(DataLoaderShuffle, TheDocumentedRuleExactly) {
  // data_loader.h's rule recomputed independently (Python: splitmix64 from splitmix64(1234) xor e,
  // Fisher-Yates with j = (draw * (i + 1)) >> 64) for the 10 windows of 6 tokens, passes 0 and 1:
  // pinned, so a change to the draw or the mapping, which would silently change every resumed
  // order, fails here.
  const std::vector<int64_t> expected = {30, 54, 24, 6, 48, 18, 12, 0, 42, 36,
                                         54, 42, 30, 24, 6, 18, 48, 36, 0, 12};
  EXPECT_EQ(shuffled_starts(1, 1234, 20), expected);
}
