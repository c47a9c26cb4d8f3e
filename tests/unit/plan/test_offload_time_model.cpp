// NVMe offload in the time model and in `plan --search` (issues 24 and 26): the disk's seconds are the
// offloaded bytes at the profile's measured bandwidths, hidden under the optimizer's compute only as far
// as the engine overlaps them; a profile measured before the disk was (no disk fields) still loads and
// refuses to price offload, naming the field and the command; the search lists offloaded layouts with
// the bytes `plan` gives the same layout and ranks them by time, so offload comes first only where
// nothing without it fits.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <nlohmann/json.hpp>

#include "model/llama_config.h"
#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "util/error.h"
#include "../../support/error_of.h"

using namespace shardlm;
using test_support::error_of;

namespace {

constexpr double kFreeRate = 1e30;  // a rate that makes its phase free

// One rate for every shape; AdamW at `optimizer` elements/s; the disk writing and reading at the given
// bytes/s for every transfer size.
plan::MachineProfile profile(double optimizer, double disk_write, double disk_read, double gemm = kFreeRate) {
  plan::MachineProfile p;
  for (const char* dt : {"fp32", "bf16"}) {
    p.gemm.push_back({dt, 64, 64, 64, gemm});
    p.attention_forward[dt] = p.attention_backward[dt] = gemm;
  }
  p.stream_bytes_per_s = kFreeRate;
  p.optimizer_elements_per_s = optimizer;
  p.disk = {{1 << 20, disk_write, disk_read}};
  p.disk_dir = "/var/tmp";
  return p;
}

plan::PlanRequest tiny(const std::string& precision = "fp32") {
  plan::PlanRequest r;
  r.model = model::preset("tiny");
  r.model_name = "tiny";
  r.devices = 1;
  r.micro_batch = 2;
  r.seq_len = 32;
  r.precision = precision;
  return r;
}

plan::StepTimePrediction predict(plan::PlanRequest r, int stage, const plan::MachineProfile& mp) {
  r.zero_stage = stage;
  return plan::predict_step_time(plan::make_plan(r), stage, mp);
}

}  // namespace

TEST(OffloadTimeModel, StateOffloadReadsAndWritesTheStatesBesideTheOptimizer) {
  auto plain = tiny();
  auto off = plain;
  off.offload_optimizer_nvme = true;
  // The states that move: the plan's fp32 moments (fp32 compute: the master is the parameter).
  plain.zero_stage = 1;
  const auto without = plan::make_plan(plain).stages[0].memory;
  const double B = static_cast<double>(without.optimizer_states + without.master_params);
  off.zero_stage = 1;
  EXPECT_EQ(plan::make_plan(off).stages[0].memory.offloaded, static_cast<int64_t>(B));
  // A slow disk: the step waits for it (reads then writes share it), plus the first chunk's read
  // (65536 elements x 8 bytes of moments), which nothing hides.
  const auto mp = profile(1e6, 2e6, 1e6);
  const auto base = predict(plain, 1, mp), slow = predict(off, 1, mp);
  const double io = B / 1e6 + B / 2e6;
  ASSERT_GT(io, base.optimizer_s);  // the disk is what the step waits for here
  EXPECT_NEAR(slow.optimizer_s, io + 65536.0 * 8 / 1e6, 1e-9);
  EXPECT_NEAR(slow.offload_io_s, io, 1e-9);
  EXPECT_NEAR(slow.offload_exposed_s, slow.optimizer_s - base.optimizer_s, 1e-9);
  EXPECT_NEAR(slow.step_s - base.step_s, slow.offload_exposed_s, 1e-9);
  EXPECT_DOUBLE_EQ(slow.forward_s, base.forward_s);
  // Where the profile measured the step's own pattern (reads ahead while rewriting), that rate prices it.
  auto streamed = mp;
  streamed.disk[0].stream_bytes_per_s = 5e5;
  EXPECT_NEAR(predict(off, 1, streamed).offload_io_s, 2 * B / 5e5, 1e-9);
  // A fast disk hides under the optimizer: the step costs what it costs without offload.
  const auto fast = predict(off, 1, profile(1e6, 1e12, 1e12));
  EXPECT_NEAR(fast.optimizer_s, base.optimizer_s, 1e-6);
  // bf16 compute: the fp32 masters move too (12 bytes per element).
  auto bf16 = off;
  bf16.precision = "bf16";
  const auto m16 = plan::make_plan(bf16).stages[0].memory;
  EXPECT_EQ(m16.master_params + m16.optimizer_states, 0);
  const auto t16 = predict(bf16, 1, mp);
  const double b16 = static_cast<double>(m16.offloaded);
  EXPECT_NEAR(t16.optimizer_s, b16 / 1e6 + b16 / 2e6 + 65536.0 * 12 / 1e6, 1e-9);
}

TEST(OffloadTimeModel, ParameterOffloadReadsEachShardInForwardAndBackwardAndWritesItOnce) {
  auto r = tiny();
  r.accumulation = 2;
  r.offload_param_nvme = true;
  r.offload_param_max_in_cpu = 0;
  r.persistence_threshold = 0;  // tiny's units are all below the default: none would leave memory
  r.zero_stage = 3;
  const double P = static_cast<double>(plan::make_plan(r).stages[0].memory.offloaded);
  ASSERT_GT(P, 0);
  const auto mp = profile(1e6, 2e6, 1e6);
  // fp32: every micro-step's forward and backward read every shard; the step reads each (the master
  // it updates) and writes it back.
  const auto t = predict(r, 3, mp);
  EXPECT_NEAR(t.offload_io_s, 2 * 2 * P / 1e6 + P / 1e6 + P / 2e6, 1e-9);
  // Compute is free here: each pass waits for its reads.
  EXPECT_GE(t.forward_s, 2 * P / 1e6 - 1e-9);
  EXPECT_GE(t.backward_s, 2 * P / 1e6 - 1e-9);
  // 16-bit: the step casts the resident masters into fresh shards and writes them (no read), after the
  // in-memory update.
  auto h = r;
  h.precision = "bf16";
  const double P16 = static_cast<double>(plan::make_plan(h).stages[0].memory.offloaded);
  EXPECT_NEAR(P16, P / 2, 1);
  auto h_plain = h;
  h_plain.offload_param_nvme = false;
  const auto t16 = predict(h, 3, mp), base16 = predict(h_plain, 3, mp);
  EXPECT_NEAR(t16.offload_io_s, 2 * 2 * P16 / 1e6 + P16 / 2e6, 1e-9);
  EXPECT_NEAR(t16.optimizer_s, base16.optimizer_s + P16 / 2e6, 1e-9);
  // With slow compute, the forward's reads hide under it but for the first unit's.
  const auto slow_compute = profile(1e6, 2e6, 1e6, 1e6);
  const auto hidden = predict(r, 3, slow_compute);
  auto r_plain = r;
  r_plain.offload_param_nvme = false;
  const auto compute = predict(r_plain, 3, slow_compute);
  ASSERT_GT(compute.forward_s, 2 * P / 1e6);
  EXPECT_GT(hidden.forward_s, compute.forward_s);
  EXPECT_LT(hidden.forward_s - compute.forward_s, 2 * P / 1e6 / 2);  // at most a unit's read per micro-step
}

TEST(OffloadTimeModel, ProfilesWithoutTheDiskLoadAndRefuseToPriceOffload) {
  auto j = plan::to_json(profile(1e6, 2e6, 1e6));
  for (const char* key : {"disk", "disk_dir", "disk_io_path", "optimizer_state_elements_per_s", "host_link_bytes_per_s",
                          "host_optimizer_elements_per_s"})
    j.erase(key);  // as `bench machine` wrote them before these were measured
  const auto old = plan::machine_profile_from_json(j);
  EXPECT_TRUE(old.disk.empty());
  auto r = tiny();
  EXPECT_GT(predict(r, 1, old).step_s, 0);  // without offload: as before
  r.offload_optimizer_nvme = true;
  const auto why = error_of([&] { predict(r, 1, old); });
  EXPECT_NE(why.find("disk_read_bytes_per_s"), std::string::npos) << why;
  EXPECT_NE(why.find("shardlm bench machine --disk DIR"), std::string::npos) << why;
  // The search leaves offload out with that reason, and still ranks the rest.
  r.offload_optimizer_nvme = false;
  const auto found = plan::search_layouts(r, &old);
  ASSERT_FALSE(found.fitting.empty());
  for (const auto& c : found.fitting) EXPECT_EQ(c.disk, 0);
  ASSERT_EQ(found.notes.size(), 1u);
  EXPECT_NE(found.notes[0].find("disk_read_bytes_per_s"), std::string::npos) << found.notes[0];
  // The new fields round-trip.
  const auto mp = profile(1e6, 2e6, 1e6);
  EXPECT_EQ(plan::to_json(plan::machine_profile_from_json(plan::to_json(mp))), plan::to_json(mp));
}

TEST(OffloadSearch, OffloadIsChosenOnlyWhereNothingWithoutItFits) {
  auto r = tiny();
  r.persistence_threshold = 0;  // else no unit of tiny's leaves memory, and parameter offload is not listed
  const auto mp = profile(1e8, 1e9, 1e9, 1e9);
  // No memory limit: every layout fits, and the fastest has no offload; offloaded ones are listed too.
  const auto all = plan::search_layouts(r, &mp);
  ASSERT_FALSE(all.fitting.empty());
  EXPECT_EQ(all.fitting.front().disk, 0);
  EXPECT_EQ(plan::offload_name(all.fitting.front().request), "none");
  int64_t smallest_plain = INT64_MAX, smallest_offloaded = INT64_MAX;
  std::set<std::string> kinds;
  for (const auto& c : all.fitting) {
    kinds.insert(plan::offload_name(c.request));
    (c.disk > 0 ? smallest_offloaded : smallest_plain) =
        std::min(c.disk > 0 ? smallest_offloaded : smallest_plain, c.bytes);
    // The listed bytes are `plan`'s for the same layout.
    const auto p = plan::make_plan(c.request);
    ASSERT_EQ(p.stages.size(), 1u);
    EXPECT_EQ(c.bytes, p.stages[0].memory.total());
    EXPECT_EQ(c.disk, p.stages[0].memory.offloaded);
    if (c.request.offload_param_nvme) EXPECT_EQ(c.request.zero_stage, 3);
    if (c.request.offload_optimizer_nvme) EXPECT_GE(c.request.zero_stage, 1);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"none", "states nvme", "params nvme", "states+params nvme"}));
  ASSERT_LT(smallest_offloaded, smallest_plain);
  // A device memory only offloaded layouts fit: one of them is chosen, and every one listed offloads.
  r.device_memory = static_cast<double>(smallest_plain - 1);
  const auto tight = plan::search_layouts(r, &mp);
  ASSERT_FALSE(tight.fitting.empty());
  for (const auto& c : tight.fitting) EXPECT_GT(c.disk, 0);
  for (size_t i = 1; i < tight.fitting.size(); ++i)
    EXPECT_LE(tight.fitting[i - 1].time.step_s, tight.fitting[i].time.step_s);
  // Without a profile, layouts without offload come first.
  r.device_memory = 0;
  const auto untimed = plan::search_layouts(r, nullptr);
  EXPECT_EQ(untimed.fitting.front().disk, 0);
  // A GPU profile gets no NVMe offload (not built for CUDA runs).
  auto gpu = mp;
  gpu.device = "cuda";
  for (const auto& c : plan::search_layouts(r, &gpu).fitting) EXPECT_EQ(c.disk, 0);
}

TEST(OffloadTimeModel, HostOptimizerOffloadOnAGpuCopiesBesideTheHostsAdam) {
  // ZeRO-Offload at stage 1, fp32: the gradient down and the parameters up (4 + 4 bytes per element)
  // over the link, beside the host's AdamW; the first chunk's copies (the whole shard: under 2^22) are
  // not hidden. The device's own AdamW rate no longer matters.
  auto r = tiny();
  r.offload_optimizer_host = true;
  auto gpu = profile(kFreeRate, 1e9, 1e9);
  gpu.device = "cuda";
  gpu.host_link_bytes_per_s = 1e8;
  gpu.host_optimizer_elements_per_s = 1e6;
  r.zero_stage = 1;
  const auto p = plan::make_plan(r);
  const double E = static_cast<double>(p.rank_parameters);
  ASSERT_GT(p.stages[0].memory.host, 0);
  const auto t = plan::predict_step_time(p, 1, gpu);
  EXPECT_NEAR(t.optimizer_s, std::max(E * 8 / 1e8, E / 1e6) + E * 8 / 1e8, 1e-9);
  EXPECT_NEAR(t.offload_io_s, E * 8 / 1e8, 1e-12);
  // A GPU profile without the link's rate refuses, naming the field.
  gpu.host_link_bytes_per_s = 0;
  const auto why = error_of([&] { plan::predict_step_time(p, 1, gpu); });
  EXPECT_NE(why.find("host_link_bytes_per_s"), std::string::npos) << why;
  // The search lists it on a GPU profile only (a CPU machine's optimizer already runs on the host).
  gpu.host_link_bytes_per_s = 1e8;
  r.offload_optimizer_host = false;
  r.zero_stage = -1;
  std::set<std::string> kinds;
  for (const auto& c : plan::search_layouts(r, &gpu).fitting) {
    kinds.insert(plan::offload_name(c.request));
    if (c.host > 0) EXPECT_EQ(c.host, plan::make_plan(c.request).stages[0].memory.host);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"none", "states cpu"}));
  const auto cpu = profile(1e6, 1e9, 1e9);
  for (const auto& c : plan::search_layouts(r, &cpu).fitting) EXPECT_EQ(c.host, 0);
}

// bf16 master weights (optimizer.master_precision): on a CPU profile the search offers them with every
// offload fp32 masters get (the bf16 master and Kahan's compensation in the files; the bf16 shards, the
// masters, paged as fp32 compute's), on a GPU profile only through the host optimizer (a CUDA run refuses
// them without it, and with parameter offload). The host optimizer's
// bytes price them: bf16 master (2) + compensation (2) against the fp32 master (4) and its cast buffer
// (2), so 2 bytes per shard element fewer; NVMe in the GPU layout puts master + moments + compensation
// on disk (kahan: as many bytes as fp32 masters + moments; stochastic 2 per element fewer).
TEST(OffloadTimeModel, Bf16MastersAreSearchedAndPricedWithOptimizerOffload) {
  auto r = tiny("bf16");
  r.master_precision = "bf16";
  r.master_rounding = "kahan";
  std::set<std::string> kinds, fp32_kinds;
  const auto cpu = profile(1e6, 1e9, 1e9);
  for (const auto& c : plan::search_layouts(r, &cpu).fitting) kinds.insert(plan::offload_name(c.request));
  auto fp32_request = r;
  fp32_request.master_precision = "fp32";
  for (const auto& c : plan::search_layouts(fp32_request, &cpu).fitting)
    fp32_kinds.insert(plan::offload_name(c.request));
  EXPECT_EQ(kinds, fp32_kinds);
  EXPECT_TRUE(kinds.count("states nvme"));
  auto gpu = profile(kFreeRate, 1e9, 1e9);
  gpu.device = "cuda";
  gpu.host_link_bytes_per_s = 1e8;
  gpu.host_optimizer_elements_per_s = 1e6;
  kinds.clear();
  for (const auto& c : plan::search_layouts(r, &gpu).fitting) {
    kinds.insert(plan::offload_name(c.request));
    EXPECT_EQ(c.host, plan::make_plan(c.request).stages[0].memory.host);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"states cpu"}));
  r.zero_stage = 1;
  auto fp32 = r;
  fp32.master_precision = "fp32";
  const int64_t S4 = plan::make_plan(fp32).stages[0].memory.master_params;  // 4 bytes per shard element
  ASSERT_GT(S4, 0);
  r.offload_optimizer_host = fp32.offload_optimizer_host = true;
  const auto b = plan::make_plan(r).stages[0].memory, f = plan::make_plan(fp32).stages[0].memory;
  EXPECT_EQ(b.master_params + b.optimizer_states, 0);
  EXPECT_EQ(f.host - b.host, S4 / 2);
  r.offload_optimizer_host = fp32.offload_optimizer_host = false;
  r.offload_optimizer_nvme = r.offload_optimizer_nvme_apart = true;
  fp32.offload_optimizer_nvme = fp32.offload_optimizer_nvme_apart = true;
  const auto bn = plan::make_plan(r).stages[0].memory, fn = plan::make_plan(fp32).stages[0].memory;
  EXPECT_EQ(bn.offloaded, fn.offloaded);
  EXPECT_EQ(bn.host, fn.host);  // the gradient and the cast staging: alike
  r.master_rounding = "stochastic";
  EXPECT_EQ(fn.offloaded - plan::make_plan(r).stages[0].memory.offloaded, S4 / 2);
  // Parameter offload apart from the device (a GPU's) with bf16 masters: through the host optimizer the
  // host shards are its masters, so the host holds no more than without parameter offload and the
  // shards leave the device; with NVMe states (a second copy of the masters) it is refused, naming the fix.
  r.zero_stage = 3;
  r.persistence_threshold = 0;
  const auto why = [&] { return error_of([&] { plan::make_plan(r); }); };
  r.offload_param_host = true;
  EXPECT_NE(why().find("--master-precision bf16 with parameter offload on a GPU needs the host optimizer"),
            std::string::npos)
      << why();
  r.offload_optimizer_nvme = r.offload_optimizer_nvme_apart = false;
  r.offload_optimizer_host = true;
  const auto with_params = plan::make_plan(r).stages[0].memory;
  r.offload_param_host = false;
  const auto without = plan::make_plan(r).stages[0].memory;
  ASSERT_GT(without.compute_params, 0);
  EXPECT_EQ(with_params.compute_params, 0);
  EXPECT_EQ(with_params.host, without.host);
  EXPECT_EQ(with_params.gradients, without.gradients);
}
