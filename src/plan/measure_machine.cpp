// measure_machine (measure_machine.h): times the trainer's own kernels (model::linear for products,
// model::causal_attention's fused path, optim::AdamW) on every rank at once, and the Communicator's
// collectives through `shardlm bench comm`'s code (comm/comm_bench.h, polled as the trainer
// polls them).
#include "plan/measure_machine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <fstream>
#include <set>
#include <thread>
#include <tuple>

#include "comm/comm_bench.h"
#include "model/attention.h"
#include "model/fp32_products.h"
#include "optim/adamw.h"
#include "plan/time_model.h"
#include "util/direct_file_store.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

using Clock = std::chrono::steady_clock;

at::ScalarType scalar_type(const std::string& dtype) {
  return dtype == "fp32" ? at::kFloat : dtype == "bf16" ? at::kBFloat16 : at::kHalf;
}

// Seconds per call of `fn`: one untimed call, then calls until `budget` seconds have passed (at least 2).
double seconds_per_call(const std::function<void()>& fn, double budget) {
  fn();
  int calls = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (calls < 2 || elapsed < budget) {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return elapsed / calls;
}

// The mean of a per-rank value over the world.
double mean_over_ranks(comm::Communicator& world, double v) {
  auto t = at::full({1}, v, at::kDouble);
  world.all_reduce(t);
  return t.item<double>() / world.size();
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

DiskRate measure_disk(const std::string& dir, int64_t block, int64_t bytes, int rank, std::string* io_path) {
  util::FileStoreOptions so;  // as parallel/zero/state_offload.cpp opens its store
  so.dir = dir;
  so.key = "--disk";
  so.buffer_bytes = 512 << 10;
  so.buffer_count = 1;
  so.threads = 2;
  so.reserve_bytes = bytes;
  util::FileStore store(so);
  if (io_path) *io_path = store.path_detail();
  constexpr int kInFlight = 4;
  std::vector<std::unique_ptr<char, void (*)(void*)>> buffers;
  for (int b = 0; b < kInFlight; ++b) {
    void* p = nullptr;
    if (::posix_memalign(&p, util::kDirectIoAlignment, static_cast<size_t>(block)) != 0)
      fail("bench machine: cannot allocate ", kInFlight, " buffers of ", block, " bytes");
    std::memset(p, b + 1, static_cast<size_t>(block));
    buffers.emplace_back(static_cast<char*>(p), std::free);
  }
  const int64_t files = std::max<int64_t>(kInFlight, bytes / block);
  auto name = [&](int64_t i) { return "shardlm_disk_probe.r" + std::to_string(rank) + "." + std::to_string(i); };
  // Every file once, kInFlight transfers at a time; seconds for all of them.
  auto pass = [&](bool write) {
    std::vector<util::FileStore::Ticket> in_flight(kInFlight);
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < files; ++i) {
      auto& slot = in_flight[i % kInFlight];
      slot.wait();
      char* buf = buffers[i % kInFlight].get();
      slot = write ? store.write_async(name(i), buf, block) : store.read_async(name(i), buf, block);
    }
    for (auto& t : in_flight) t.wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // The offload's step: file i read two ahead, each rewritten once read (its buffer reused once written).
  auto stream = [&] {
    std::vector<util::FileStore::Ticket> reads(files), writes(kInFlight);
    int64_t issued = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < files; ++i) {
      for (; issued < files && issued <= i + 2; ++issued) {
        writes[issued % kInFlight].wait();
        reads[issued] = store.read_async(name(issued), buffers[issued % kInFlight].get(), block);
      }
      reads[i].wait();
      writes[i % kInFlight] = store.write_async(name(i), buffers[i % kInFlight].get(), block);
    }
    for (auto& t : writes) t.wait();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  DiskRate rate;
  rate.block_bytes = block;
  try {
    pass(true);  // the files first: the offload rewrites its files in place every step
    rate.write_bytes_per_s = static_cast<double>(files * block) / pass(true);
    rate.read_bytes_per_s = static_cast<double>(files * block) / pass(false);
    rate.stream_bytes_per_s = static_cast<double>(2 * files * block) / stream();
  } catch (...) {
    for (int64_t i = 0; i < files; ++i) store.remove(name(i));
    throw;
  }
  for (int64_t i = 0; i < files; ++i) store.remove(name(i));
  return rate;
}

MachineProfile measure_machine(comm::Communicator& world, const MeasureOptions& o,
                               const std::function<void(const std::string&)>& log) {
  MachineProfile p;
  p.threads = at::get_num_threads();
  p.ranks = world.size();
  p.device = "cpu";
  p.overlap = 0;  // host-polled collectives: the ranks' cores do the reduction work
  p.description = cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads; " +
                  std::to_string(p.ranks) + " rank(s) x " + std::to_string(p.threads) + " thread(s); 16-bit products: " +
                  model::describe_bf16_products();
  char line[256];

  // Products: a grid of shapes, and the model's own (forward, dX, dW of each linear, the head).
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;
  if (o.grid)
    for (int64_t m : {512, 4096})
      for (int64_t n : {256, 1024, 4096})
        for (int64_t k : {256, 1024, 4096}) shapes.insert({m, n, k});
  if (shapes.empty() && !o.model) fail("bench machine: no products to measure (--no-grid needs --model)");
  if (o.model) {
    const double T = static_cast<double>(o.micro_batch * o.seq_len);
    auto add = [&](double t, double in, double out) {
      const auto i = [](double v) { return std::max<int64_t>(1, static_cast<int64_t>(std::llround(v))); };
      shapes.insert({i(t), i(out), i(in)});  // forward
      shapes.insert({i(t), i(in), i(out)});  // dX
      shapes.insert({i(out), i(in), i(t)});  // dW
    };
    for (int64_t l = 0; l < o.model->num_hidden_layers; ++l)
      for (const auto& lin : layer_linears(*o.model, l, T, o.tp)) add(lin.tokens, lin.in, lin.out);
    add(T, static_cast<double>(o.model->hidden_size), static_cast<double>(o.model->vocab_size) / o.tp);
  }
  for (const auto& dtype : o.dtypes) {
    const auto st = scalar_type(dtype);
    for (const auto& [m, n, k] : shapes) {
      const auto a = at::randn({m, k}).to(st), w = at::randn({n, k}).to(st);
      const double s = seconds_per_call([&] { (void)model::linear(a, w); }, o.seconds_per_item);
      const double rate = mean_over_ranks(world, 2.0 * m * n * k / s);
      p.gemm.push_back({dtype, m, n, k, rate});
      std::snprintf(line, sizeof line, "gemm %s m=%lld n=%lld k=%lld: %.1f GFLOP/s", dtype.c_str(),
                    static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), rate / 1e9);
      log(line);
    }
    // The fused attention kernel, causal, at the model's shape (or 8 heads of 64 over 512 positions).
    const int64_t heads = o.model ? o.model->num_attention_heads / o.tp : 8;
    const int64_t d = o.model ? o.model->head_dim() : 64, s = o.model ? o.seq_len : 512, b = o.model ? o.micro_batch : 4;
    const auto opts = at::TensorOptions().dtype(st);
    auto q = at::randn({b, heads, s, d}, opts).requires_grad_(), k = at::randn({b, heads, s, d}, opts).requires_grad_(),
         v = at::randn({b, heads, s, d}, opts).requires_grad_();
    const double flops = 4.0 * b * heads * s * ((s + 1) / 2.0) * d;
    at::Tensor out;
    const double fwd = seconds_per_call(
        [&] {
          at::NoGradGuard no_grad;
          out = model::causal_attention(q, k, v, model::Attention::Sdpa);
        },
        o.seconds_per_item);
    const double both = seconds_per_call(
        [&] {
          auto y = model::causal_attention(q, k, v, model::Attention::Sdpa);
          y.backward(at::ones_like(y));
        },
        o.seconds_per_item);
    p.attention_forward[dtype] = mean_over_ranks(world, flops / fwd);
    p.attention_backward[dtype] = mean_over_ranks(world, flops / std::max(both - fwd, 1e-9));
    std::snprintf(line, sizeof line, "attention %s b=%lld heads=%lld s=%lld d=%lld: forward %.1f, backward %.1f GFLOP/s",
                  dtype.c_str(), static_cast<long long>(b), static_cast<long long>(heads), static_cast<long long>(s),
                  static_cast<long long>(d), p.attention_forward[dtype] / 1e9, p.attention_backward[dtype] / 1e9);
    log(line);
  }

  // Stream: out = a + b over 32 Mi floats (read two, write one).
  {
    const int64_t n = 32 << 20;
    auto a = at::ones({n}), b = at::ones({n}), out = at::empty({n});
    const double s = seconds_per_call([&] { at::add_out(out, a, b); }, o.seconds_per_item);
    p.stream_bytes_per_s = mean_over_ranks(world, 3.0 * 4 * n / s);
    std::snprintf(line, sizeof line, "stream (a + b, fp32, 384 MiB touched): %.2f GB/s per rank", p.stream_bytes_per_s / 1e9);
    log(line);
  }
  // The optimizer: shardlm's AdamW over 8 Mi fp32 elements, with fp32, bf16 and 8-bit moments.
  for (const char* states : {"fp32", "bf16", "8bit"}) {
    const int64_t n = 8 << 20;
    std::vector<optim::Segment> segs = {{"w", at::randn({n}), at::randn({n}) * 1e-3, true}};
    optim::AdamWOptions ao;
    ao.state_precision = optim::parse_state_precision(states);
    optim::AdamW adam(segs, ao);
    const double s = seconds_per_call([&] { adam.step(1e-4); }, o.seconds_per_item);
    const double rate = mean_over_ranks(world, n / s);
    if (std::string(states) == "fp32") p.optimizer_elements_per_s = rate;
    else p.optimizer_state_elements_per_s[states] = rate;
    std::snprintf(line, sizeof line, "AdamW step, %s moments: %.1f M elements/s per rank", states, rate / 1e6);
    log(line);
  }
  // The disk under --disk, every rank at once (they share it), at the offload's transfer sizes.
  if (!o.disk_dir.empty()) {
    p.disk_dir = o.disk_dir;
    for (int64_t block : o.disk_blocks) {
      const auto d = measure_disk(o.disk_dir, block, o.disk_bytes, world.rank(), &p.disk_io_path);
      p.disk.push_back({block, mean_over_ranks(world, d.write_bytes_per_s), mean_over_ranks(world, d.read_bytes_per_s),
                        mean_over_ranks(world, d.stream_bytes_per_s)});
      std::snprintf(line, sizeof line,
                    "disk %s, %lld KiB files (%s): rewrite %.0f MB/s, read %.0f MB/s, read-ahead + rewrite %.0f MB/s "
                    "per rank",
                    o.disk_dir.c_str(), static_cast<long long>(block >> 10), p.disk_io_path.c_str(),
                    p.disk.back().write_bytes_per_s / 1e6, p.disk.back().read_bytes_per_s / 1e6,
                    p.disk.back().stream_bytes_per_s / 1e6);
      log(line);
    }
  }
  // Collectives, started and polled as the trainer does.
  if (world.size() > 1) {
    observe::CommBenchOptions co;
    co.min_bytes = 64 << 10;
    co.max_bytes = o.collective_max_bytes;
    co.factor = 4;
    co.nonblocking = true;
    co.ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast"};
    const auto res = observe::run_comm_bench(world, co, [](const std::string&) {});
    for (const auto& row : res.rows) {
      const double t = row.time_us * 1e-6;
      p.collectives.push_back({row.op, row.bytes, row.busbw_gbps * 1e9, t});
      // Pipeline sends: one rank's message to one other, priced as a broadcast between two ranks.
      if (row.op == "broadcast")
        p.collectives.push_back({"p2p", row.bytes, row.busbw_gbps * 1e9, t});
      std::snprintf(line, sizeof line, "%s %lld B: %.1f us, busbw %.2f GB/s", row.op.c_str(),
                    static_cast<long long>(row.bytes), row.time_us, row.busbw_gbps);
      log(line);
    }
  }
  return p;
}

}  // namespace shardlm::plan
