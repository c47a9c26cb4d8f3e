// NVMe optimizer-state offload (parallel/zero/state_offload.h) against the optimizer stepping in
// memory, which is the reference: the same segments (fp32, bf16 and 8-bit moments; separate fp32
// masters or not) stepped through files in small chunks, with 2 and 3 buffers, through O_DIRECT and
// the buffered path, give bit-identical masters and moments after several steps; paging in and out
// (checkpoints) round-trips the states; the files go away with the offload. bf16 masters (Kahan:
// its compensation in the files beside the moments, piece by piece; stochastic) step bit for bit too,
// with the master in the files (a GPU run's host copy) or in place.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "parallel/zero/state_offload.h"

using namespace shardlm;
namespace fs = std::filesystem;

namespace {

struct Model {
  std::vector<at::Tensor> params, grads;
  std::unique_ptr<optim::AdamW> opt;
};

// Three segments; the second a ZeRO-like slice starting inside a quantization block (param_offset 100).
Model make(optim::StatePrecision precision, optim::MasterRounding masters = optim::MasterRounding::None) {
  at::manual_seed(7);
  Model m;
  std::vector<optim::Segment> segs;
  const int64_t sizes[] = {5000, 3333, 70};
  for (int k = 0; k < 3; ++k) {
    m.params.push_back(at::randn({sizes[k]}).to(masters == optim::MasterRounding::None ? at::kFloat : at::kBFloat16));
    m.grads.push_back(at::zeros({sizes[k]}));
    optim::Segment s{"p" + std::to_string(k), m.params.back(), m.grads.back(), k != 2};
    if (k == 1) {
      s.param_offset = 100;
      s.param_numel = 5000;
    }
    segs.push_back(s);
  }
  optim::AdamWOptions o{1e-2, 0.9, 0.95, 1e-8, 0.1};
  o.state_precision = precision;
  o.min_8bit_size = 1000;  // the 70-element segment keeps fp32 moments
  o.masters = masters;
  o.seed = 3;
  m.opt = std::make_unique<optim::AdamW>(std::move(segs), o);
  return m;
}

std::string fresh_dir() {
  char tmpl[] = "/var/tmp/shardlm_state_offload_XXXXXX";
  return ::mkdtemp(tmpl);
}

void expect_same(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  EXPECT_TRUE(at::equal(a.reshape({-1}), b.reshape({-1}))) << what;
}

}  // namespace

TEST(StateOffload, StepsBitIdenticalToTheOptimizerInMemory) {
  for (auto precision : {optim::StatePrecision::FP32, optim::StatePrecision::BF16, optim::StatePrecision::Int8}) {
    for (int buffers : {2, 3}) {
      for (auto direct : {util::DirectIo::Auto, util::DirectIo::Off}) {
        SCOPED_TRACE(std::string(optim::state_precision_name(precision)) + " buffers " + std::to_string(buffers) +
                     (direct == util::DirectIo::Off ? " buffered" : " auto"));
        auto ref = make(precision), off = make(precision);
        const std::string dir = fresh_dir();
        // Separate masters: the offloaded optimizer's masters are copies the offload owns.
        std::vector<at::Tensor> masters;
        {
          parallel::StateOffloadOptions so;
          so.dir = dir;
          so.buffer_count = buffers;
          so.chunk_elements = 1024;  // several chunks, segments cut inside
          so.direct = direct;
          parallel::StateOffload offload(*off.opt, /*separate_masters=*/true, so);
          EXPECT_GT(offload.chunks(), 5u);
          EXPECT_FALSE(off.opt->exp_avg(0).defined());  // in the files now
          EXPECT_FALSE(off.opt->segments()[0].param.defined());
          for (int step = 0; step < 4; ++step) {
            for (size_t k = 0; k < ref.grads.size(); ++k) {
              const auto g = at::randn(ref.grads[k].sizes());
              ref.grads[k].copy_(g);
              off.grads[k].copy_(g);
            }
            const std::vector<double> multipliers{1.0, 0.5, 2.0};
            ref.opt->step(1e-2, &multipliers);
            std::vector<at::Tensor> updated(3);
            offload.step(1e-2, &multipliers, [&](const optim::AdamW::Piece& p) {
              if (!updated[p.segment].defined()) updated[p.segment] = at::zeros({off.params[p.segment].numel()});
              updated[p.segment].narrow(0, p.begin, p.numel).copy_(p.param);
            });
            for (size_t k = 0; k < 3; ++k) expect_same(ref.params[k], updated[k], "master " + std::to_string(k));
          }
          EXPECT_EQ(off.opt->steps_taken(), ref.opt->steps_taken());
          // Paged in (a checkpoint): every state equals the reference's.
          for (size_t k = 0; k < 3; ++k) masters.push_back(at::zeros({off.params[k].numel()}));
          offload.page_in([&](size_t k) { return masters[k]; });
          for (size_t k = 0; k < 3; ++k) {
            expect_same(ref.params[k], off.opt->segments()[k].param, "paged-in master");
            expect_same(ref.opt->exp_avg(k), off.opt->exp_avg(k), "exp_avg");
            expect_same(ref.opt->exp_avg_sq(k), off.opt->exp_avg_sq(k), "exp_avg_sq");
            if (ref.opt->format(k) == optim::StatePrecision::Int8) {
              expect_same(ref.opt->absmax(k, false), off.opt->absmax(k, false), "absmax1");
              expect_same(ref.opt->absmax(k, true), off.opt->absmax(k, true), "absmax2");
            }
          }
          // Changed while paged in (a checkpoint loaded), written back, and read again.
          off.opt->exp_avg(0).fill_(0);
          offload.page_out(/*write=*/true);
          EXPECT_FALSE(off.opt->exp_avg(0).defined());
          offload.page_in([&](size_t k) { return masters[k]; });
          if (off.opt->format(0) != optim::StatePrecision::Int8)
            EXPECT_EQ(off.opt->exp_avg(0).abs().max().item<double>(), 0.0);
          offload.page_out(/*write=*/false);
          EXPECT_FALSE(fs::is_empty(dir));
        }
        EXPECT_TRUE(fs::is_empty(dir)) << "the state files outlive the offload";
        fs::remove_all(dir);
      }
    }
  }
}

TEST(StateOffload, MomentsOnlyWhenTheMasterIsTheComputeShard) {
  auto ref = make(optim::StatePrecision::FP32), off = make(optim::StatePrecision::FP32);
  const std::string dir = fresh_dir();
  {
    parallel::StateOffloadOptions so;
    so.dir = dir;
    so.chunk_elements = 2048;
    parallel::StateOffload offload(*off.opt, /*separate_masters=*/false, so);
    EXPECT_GE(offload.bytes(), 2 * 4 * (5000 + 3333 + 70));
    EXPECT_LT(offload.bytes(), 2 * 4 * (5000 + 3333 + 70) + 6 * 64 * 8);  // alignment of the regions only
    EXPECT_TRUE(off.opt->segments()[0].param.defined());  // the master stays where it is
    for (int step = 0; step < 3; ++step) {
      for (size_t k = 0; k < ref.grads.size(); ++k) {
        const auto g = at::randn(ref.grads[k].sizes());
        ref.grads[k].copy_(g);
        off.grads[k].copy_(g);
      }
      ref.opt->step(3e-3);
      offload.step(3e-3, nullptr, [](const optim::AdamW::Piece&) {});
      for (size_t k = 0; k < 3; ++k) expect_same(ref.params[k], off.params[k], "parameter");
    }
  }
  fs::remove_all(dir);
}

TEST(StateOffload, TooFewBuffersAndAMissingDirectoryAreRefusedNamingTheKey) {
  auto m = make(optim::StatePrecision::FP32);
  parallel::StateOffloadOptions so;
  so.dir = "/var/tmp/shardlm_no_such_dir_for_offload";
  so.buffer_count = 1;
  try {
    parallel::StateOffload offload(*m.opt, true, so);
    FAIL() << "one buffer accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.buffer_count = 1"), std::string::npos)
        << e.what();
  }
  so.buffer_count = 4;
  try {
    parallel::StateOffload offload(*m.opt, true, so);
    FAIL() << "a missing directory accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_optimizer.nvme_path = "
                                         "'/var/tmp/shardlm_no_such_dir_for_offload' does not exist"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(m.opt->exp_avg(0).defined());  // nothing was taken from the optimizer
}

// bf16 masters (optim/master_format.h): Kahan's bf16 compensation is optimizer state, paged with the
// moments chunk by chunk (each piece its own elements of it); the bf16 master is in the files where it
// is kept apart from the compute shard, else stepped in place. Stochastic rounding has no state of its own.
TEST(StateOffload, Bf16MastersAndKahanCompensationStepBitIdentically) {
  for (auto rounding : {optim::MasterRounding::Kahan, optim::MasterRounding::Stochastic}) {
    for (bool separate : {true, false}) {
      SCOPED_TRACE(std::string(optim::master_rounding_name(rounding)) + (separate ? " masters in the files" : " in place"));
      auto ref = make(optim::StatePrecision::FP32, rounding), off = make(optim::StatePrecision::FP32, rounding);
      const std::string dir = fresh_dir();
      {
        parallel::StateOffloadOptions so;
        so.dir = dir;
        so.buffer_count = 2;
        so.chunk_elements = 1024;  // segments cut inside: the compensation goes piece by piece
        parallel::StateOffload offload(*off.opt, separate, so);
        const bool kahan = rounding == optim::MasterRounding::Kahan;
        const int64_t n = 5000 + 3333 + 70;
        EXPECT_GE(offload.bytes(), n * (8 + (kahan ? 2 : 0) + (separate ? 2 : 0)));
        EXPECT_LT(offload.bytes(), n * (8 + (kahan ? 2 : 0) + (separate ? 2 : 0)) + 4 * 12 * 64);
        const std::string what = std::string(separate ? "bf16 masters + " : "") + "moments" +
                                 (kahan ? " + Kahan compensation" : "");
        EXPECT_NE(offload.describe().find("(" + what + ")"), std::string::npos) << offload.describe();
        EXPECT_FALSE(off.opt->compensation(0).defined());  // in the files now
        EXPECT_EQ(off.opt->segments()[0].param.defined(), !separate);
        for (int step = 0; step < 4; ++step) {
          for (size_t k = 0; k < ref.grads.size(); ++k) {
            const auto g = at::randn(ref.grads[k].sizes()) * 1e-2;
            ref.grads[k].copy_(g);
            off.grads[k].copy_(g);
          }
          ref.opt->step(1e-2);
          offload.step(1e-2, nullptr, [&](const optim::AdamW::Piece& p) {
            if (separate) off.params[p.segment].narrow(0, p.begin, p.numel).copy_(p.param);
          });
          for (size_t k = 0; k < 3; ++k) expect_same(ref.params[k], off.params[k], "master " + std::to_string(k));
        }
        std::vector<at::Tensor> masters;
        for (size_t k = 0; k < 3; ++k) masters.push_back(at::zeros({off.params[k].numel()}, at::kBFloat16));
        offload.page_in([&](size_t k) { return masters[k]; });
        for (size_t k = 0; k < 3; ++k) {
          expect_same(ref.params[k], off.opt->segments()[k].param, "paged-in master");
          expect_same(ref.opt->exp_avg_sq(k), off.opt->exp_avg_sq(k), "exp_avg_sq");
          EXPECT_EQ(off.opt->compensation(k).defined(), kahan);
          if (kahan) {
            expect_same(ref.opt->compensation(k), off.opt->compensation(k), "compensation " + std::to_string(k));
            EXPECT_GT(ref.opt->compensation(k).abs().max().item<double>(), 0.0);  // it carries something
          }
        }
        offload.page_out(/*write=*/false);
      }
      EXPECT_TRUE(fs::is_empty(dir)) << "the state files outlive the offload";
      fs::remove_all(dir);
    }
  }
}
