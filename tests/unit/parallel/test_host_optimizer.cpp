// ZeRO-Offload's host optimizer (parallel/zero/host_optimizer.h) against the in-memory AdamW, which is
// the reference: over several steps its host masters and moments equal AdamW::step's bit for bit (fp32,
// bf16 and 8-bit moments, shard slices that start inside their parameter, 16-bit device parameters and
// gradients, gradient multipliers; bf16 masters with Kahan's compensation, stochastic rounding or
// nearest), and the parameters it copies back are the masters cast. A
// recording fake of the device side checks the schedule: every element's gradient comes down and its
// parameter goes up exactly once per step, a chunk's gradients are queued and waited for before its
// parameters go up, chunk k+1's gradients are queued before chunk k steps, and chunk k's copy-back is
// queued before chunk k+1's gradients are waited for.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "parallel/zero/host_optimizer.h"
#include "util/error.h"

using namespace shardlm;
using parallel::HostOptimizer;

namespace {

struct Event {
  char op;  // 'b' begin, 'h' to_host, 'q' grads_queued, 'w' wait_grads, 'd' to_device, 'f' finish
  size_t chunk;
  int64_t numel;
};

// Synchronous copies, like a CPU device, and a log of every call.
class RecordingTransfers : public parallel::OffloadTransfers {
 public:
  explicit RecordingTransfers(std::vector<Event>* log) : log_(log) {}
  bool pinned() const override { return false; }
  void begin() override { log_->push_back({'b', 0, 0}); }
  void to_host(size_t k, const at::Tensor& host, const at::Tensor& device) override {
    host.copy_(device);
    log_->push_back({'h', k, host.numel()});
  }
  void grads_queued(size_t k) override { log_->push_back({'q', k, 0}); }
  void wait_grads(size_t k) override { log_->push_back({'w', k, 0}); }
  void to_device(size_t k, const at::Tensor& device, const at::Tensor& host) override {
    device.copy_(host);
    log_->push_back({'d', k, host.numel()});
  }
  void finish() override { log_->push_back({'f', 0, 0}); }

 private:
  std::vector<Event>* log_;
};

struct Case {
  optim::StatePrecision precision;
  at::ScalarType device_dtype;  // the compute parameters and gradients
  optim::MasterRounding masters = optim::MasterRounding::None;  // else bf16 masters (device_dtype bf16)
};

// Three segments: a shard slice starting inside a 9000-element parameter, a small whole parameter
// (8-bit keeps its moments fp32) and a large one without weight decay.
void run_case(const Case& c, std::vector<Event>* log) {
  at::manual_seed(11);
  const std::vector<int64_t> sizes = {5000, 300, 20000};
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.state_precision = c.precision;
  o.min_8bit_size = 4096;
  o.masters = c.masters;
  o.seed = 7;
  const auto master_dtype = c.masters == optim::MasterRounding::None ? at::kFloat : at::kBFloat16;
  std::vector<optim::Segment> ref_segments;
  std::vector<parallel::HostShard> shards;
  std::vector<at::Tensor> dev_grads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const at::Tensor master = at::randn({sizes[i]}, at::kFloat).to(master_dtype);
    const at::Tensor grad = at::zeros({sizes[i]}, c.device_dtype);
    optim::Segment s{"s" + std::to_string(i), master.clone(), grad, i != 2};
    if (i == 0) {
      s.param_offset = 100;
      s.param_numel = 9000;
    }
    ref_segments.push_back(s);
    parallel::HostShard h;
    h.segment = s;
    h.segment.param = master.clone();
    h.device_param = master.to(c.device_dtype);
    h.device_grad = grad;
    shards.push_back(h);
    dev_grads.push_back(grad);
  }
  optim::AdamW ref(ref_segments, o);
  parallel::HostOptimizerOptions ho;
  ho.chunk_elements = 4096;
  ho.piece_elements = 1000;
  HostOptimizer host(shards, o, std::make_unique<RecordingTransfers>(log), ho);
  ASSERT_GE(host.chunks(), 6u);
  const std::vector<double> multipliers = {0.5, 1.0, 2.0};
  for (int step = 0; step < 3; ++step) {
    for (auto& g : dev_grads) g.copy_(at::randn({g.numel()}) * 1e-1);
    log->clear();
    ref.step(1e-2 * (step + 1), &multipliers);
    host.step(1e-2 * (step + 1), &multipliers);
    for (size_t i = 0; i < sizes.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + " segment " + std::to_string(i));
      EXPECT_TRUE(at::equal(host.master(i), ref.segments()[i].param));
      EXPECT_TRUE(at::equal(host.adam().exp_avg(i), ref.exp_avg(i)));
      EXPECT_TRUE(at::equal(host.adam().exp_avg_sq(i), ref.exp_avg_sq(i)));
      if (ref.compensation(i).defined()) EXPECT_TRUE(at::equal(host.adam().compensation(i), ref.compensation(i)));
      EXPECT_EQ(host.adam().compensation(i).defined(), c.masters == optim::MasterRounding::Kahan);
      if (ref.absmax(i, false).defined()) {
        EXPECT_TRUE(at::equal(host.adam().absmax(i, false), ref.absmax(i, false)));
        EXPECT_TRUE(at::equal(host.adam().absmax(i, true), ref.absmax(i, true)));
      }
      EXPECT_TRUE(at::equal(shards[i].device_param, ref.segments()[i].param.to(c.device_dtype)));
    }
  }
  EXPECT_EQ(host.adam().steps_taken(), 3);
}

}  // namespace

TEST(HostOptimizer, StepsEqualTheInMemoryAdamWBitForBit) {
  const std::vector<Case> cases = {{optim::StatePrecision::FP32, at::kFloat},
                                   {optim::StatePrecision::FP32, at::kBFloat16},
                                   {optim::StatePrecision::BF16, at::kBFloat16},
                                   {optim::StatePrecision::Int8, at::kBFloat16},
                                   // bf16 masters (optim/master_format.h): the host master is bf16, Kahan's
                                   // compensation is stepped piece by piece like the moments, the stochastic
                                   // stream follows each piece's element index in its parameter.
                                   {optim::StatePrecision::FP32, at::kBFloat16, optim::MasterRounding::Kahan},
                                   {optim::StatePrecision::BF16, at::kBFloat16, optim::MasterRounding::Kahan},
                                   {optim::StatePrecision::FP32, at::kBFloat16, optim::MasterRounding::Stochastic},
                                   {optim::StatePrecision::Int8, at::kBFloat16, optim::MasterRounding::Nearest}};
  for (const Case& c : cases) {
    SCOPED_TRACE("precision " + std::to_string(static_cast<int>(c.precision)) + " dtype " +
                 std::string(c10::toString(c.device_dtype)) + " masters " + optim::master_rounding_name(c.masters));
    std::vector<Event> log;
    run_case(c, &log);
  }
}

TEST(HostOptimizer, CopiesOverlapTheStepsInOrder) {
  std::vector<Event> log;
  run_case({optim::StatePrecision::FP32, at::kBFloat16}, &log);  // the log holds the last step
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front().op, 'b');
  EXPECT_EQ(log.back().op, 'f');
  size_t chunks = 0;
  for (const Event& e : log)
    if (e.op == 'w') ++chunks;
  ASSERT_GE(chunks, 6u);
  auto at = [&](char op, size_t k, bool last) {  // index of the first (or last) such event; -1 if none
    long found = -1;
    for (size_t j = 0; j < log.size(); ++j)
      if (log[j].op == op && log[j].chunk == k) {
        found = static_cast<long>(j);
        if (!last) break;
      }
    return found;
  };
  int64_t down = 0, up = 0;
  for (const Event& e : log) {
    if (e.op == 'h') down += e.numel;
    if (e.op == 'd') up += e.numel;
  }
  EXPECT_EQ(down, 5000 + 300 + 20000);  // every element once, each way
  EXPECT_EQ(up, 5000 + 300 + 20000);
  for (size_t k = 0; k < chunks; ++k) {
    SCOPED_TRACE("chunk " + std::to_string(k));
    ASSERT_GE(at('h', k, false), 0);
    EXPECT_EQ(at('q', k, false), at('h', k, true) + 1);  // queued right after its copies
    EXPECT_LT(at('q', k, false), at('w', k, false));     // waited for after being queued
    EXPECT_LT(at('w', k, false), at('d', k, false));     // the step (between them) reads landed gradients
    EXPECT_EQ(at('w', k, false), at('w', k, true));      // waited for once
    if (k + 1 < chunks) {
      EXPECT_LT(at('q', k + 1, false), at('w', k, false));  // chunk k+1 comes down while chunk k steps
      EXPECT_LT(at('d', k, true), at('w', k + 1, false));   // chunk k goes up while chunk k+1 steps
    }
  }
}

TEST(HostOptimizer, RefusesLambNamingTheFix) {
  optim::AdamWOptions o;
  o.rule = optim::UpdateRule::Lamb;
  parallel::HostShard h;
  h.segment = {"w", at::zeros({10}), at::zeros({10})};
  h.device_param = at::zeros({10});
  h.device_grad = at::zeros({10});
  try {
    HostOptimizer host({h}, o, parallel::make_offload_transfers(c10::Device(c10::kCPU)));
    FAIL() << "Lamb accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.device"), std::string::npos) << e.what();
  }
}

// The engine's GPU layout (zero_engine.h host_buffers_apart): a shared optimizer whose masters and
// gradients are host buffers apart from the device tensors, and a staging buffer of the caller's. The
// device gradient comes down into the optimizer's gradient, the cast masters wait in that staging
// buffer and go up into the device parameter; the log line says the buffers are apart; a staging
// buffer of the wrong size is refused.
TEST(HostOptimizer, SharedOptimizerApartCopiesThroughTheCallersStagingBuffer) {
  at::manual_seed(5);
  const int64_t n = 3000;
  optim::AdamWOptions o;
  o.lr = 1e-2;
  const at::Tensor master = at::randn({n}), host_grad = at::zeros({n}, at::kBFloat16);
  optim::AdamW adam({{"w@0", master, host_grad, true}}, o);
  optim::AdamW ref({{"w@0", master.clone(), at::zeros({n}, at::kBFloat16), true}}, o);
  parallel::HostShard h;
  h.segment = adam.segments()[0];
  h.device_param = master.to(at::kBFloat16);
  h.device_grad = (at::randn({n}) * 1e-1).to(at::kBFloat16);
  h.host_stage = at::zeros({n}, at::kBFloat16);
  std::vector<Event> log;
  parallel::HostOptimizerOptions ho;
  ho.chunk_elements = 1024;
  ho.piece_elements = 256;
  HostOptimizer host(adam, {h}, std::make_unique<RecordingTransfers>(&log), ho);
  EXPECT_NE(host.describe().find("apart from the device's"), std::string::npos) << host.describe();
  ref.segments()[0].grad.copy_(h.device_grad);
  ref.step(1e-2);
  host.step(1e-2);
  EXPECT_TRUE(at::equal(host_grad, h.device_grad));  // came down
  EXPECT_TRUE(at::equal(master, ref.segments()[0].param));
  EXPECT_TRUE(at::equal(h.host_stage, master.to(at::kBFloat16)));  // staged in the caller's buffer
  EXPECT_TRUE(at::equal(h.device_param, h.host_stage));            // and went up
  h.host_stage = at::zeros({n - 1}, at::kBFloat16);
  try {
    HostOptimizer bad(adam, {h}, std::make_unique<RecordingTransfers>(&log), ho);
    FAIL() << "a staging buffer of the wrong size accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("staging buffer of 2999 elements"), std::string::npos) << e.what();
  }
}
