#include "comm/comm_bench.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "comm/mpi_communicator.h"
#include "util/error.h"
#include "util/units.h"

namespace shardlm::observe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// Test pattern: small integers, exact in bf16 and in their sums over a few ranks.
inline float pattern(int rank, int64_t i) { return static_cast<float>(rank % 13 + 1 + i % 5); }

template <typename F>
void dispatch(at::ScalarType t, F&& f) {
  if (t == at::kFloat) f(float{});
  else if (t == at::kBFloat16) f(c10::BFloat16{});
  else fail("bench comm: unsupported dtype ", t, " (float32 or bfloat16)");
}

template <typename T>
void fill_pattern(const at::Tensor& t, int rank, int64_t offset) {
  T* p = static_cast<T*>(t.data_ptr());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = T(pattern(rank, offset + i));
}

template <typename T>
void fill_value(const at::Tensor& t, float v) {
  T* p = static_cast<T*>(t.data_ptr());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = T(v);
}

template <typename T, typename Expected>
int64_t count_wrong(const at::Tensor& t, Expected expected, double rel_tol) {
  const T* p = static_cast<const T*>(t.data_ptr());
  const int64_t n = t.numel();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = expected(i);
    const double got = static_cast<float>(p[i]);
    if (!(std::fabs(got - want) <= rel_tol * std::fabs(want))) ++wrong;
  }
  return wrong;
}

// Completes a call started with an _async form: by wait() (blocking), or by polling test() as the
// trainer's backward does between its computations (nonblocking); after a while the poll yields
// its core (at once where the node has more ranks than cores), so ranks sharing cores still reach
// the collective.
void complete(const comm::WorkPtr& w, bool nonblocking) {
  if (!nonblocking) return w->wait();
  const int spins = comm::node_oversubscribed() ? 0 : 2000;
  for (int polls = 0; !w->test(); ++polls)
    if (polls >= spins) std::this_thread::yield();
}

void zero_bytes(const at::Tensor& t) { std::memset(t.data_ptr(), 0, t.numel() * t.element_size()); }

// One operation at one size: which prefixes of the two long-lived buffers it uses, how to run it,
// how to set up and verify a checkable result.
struct OpCase {
  int64_t bytes = 0, count = 0;
  int root = -1;
  std::function<void()> run;
  std::function<void()> fill;       // writes inputs whose result check() knows
  std::function<int64_t()> check;   // elements of this rank's result that are wrong
  std::function<void()> clear;      // zeroes what run() touches (timing runs on zeros)
};

OpCase make_case(comm::Communicator& comm, const std::string& op, int64_t requested_bytes, const at::Tensor& a,
                 const at::Tensor& b, at::ScalarType dtype, bool nb) {
  const int n = comm.size(), r = comm.rank();
  const int64_t elt = a.element_size();
  const int64_t total = requested_bytes / elt;
  double sumr = 0;
  for (int s = 0; s < n; ++s) sumr += s % 13 + 1;
  const double tol = dtype == at::kBFloat16 ? 0.01 * std::max(1, n / 4) : 1e-6;
  OpCase c;
  if (op == "all_reduce" || op == "broadcast") {
    at::Tensor buf = a.narrow(0, 0, total);
    c.bytes = total * elt;
    c.count = total;
    c.clear = [buf] { zero_bytes(buf); };
    if (op == "all_reduce") {
      c.run = [&comm, buf, nb] { complete(comm.all_reduce_async(buf), nb); };
      c.fill = [=] { dispatch(dtype, [&](auto tag) { fill_pattern<decltype(tag)>(buf, r, 0); }); };
      c.check = [=] {
        int64_t w = 0;
        dispatch(dtype, [&](auto tag) {
          w = count_wrong<decltype(tag)>(buf, [&](int64_t i) { return sumr + n * static_cast<double>(i % 5); }, tol);
        });
        return w;
      };
    } else {
      c.root = 0;
      c.run = [&comm, buf, nb] { complete(comm.broadcast_async(buf, 0), nb); };
      c.fill = [=] {
        dispatch(dtype, [&](auto tag) {
          if (r == 0) fill_pattern<decltype(tag)>(buf, 0, 0);
          else fill_value<decltype(tag)>(buf, -1.f);
        });
      };
      c.check = [=] {
        int64_t w = 0;
        dispatch(dtype, [&](auto tag) {
          w = count_wrong<decltype(tag)>(buf, [&](int64_t i) { return static_cast<double>(pattern(0, i)); }, tol);
        });
        return w;
      };
    }
    return c;
  }
  // reduce_scatter / all_gather: nccl-tests rounds the chunk down to 16 bytes and reports the
  // full buffer of n chunks.
  const int64_t align = std::max<int64_t>(1, 16 / elt);
  const int64_t chunk = (total / n) / align * align;
  if (chunk == 0) return c;  // too small for this many ranks: the row is skipped
  at::Tensor full = a.narrow(0, 0, chunk * n);
  at::Tensor part = b.narrow(0, 0, chunk);
  c.bytes = chunk * n * elt;
  c.count = chunk * n;
  c.clear = [full, part] {
    zero_bytes(full);
    zero_bytes(part);
  };
  if (op == "reduce_scatter") {
    c.run = [&comm, full, part, nb] { complete(comm.reduce_scatter_async(full, part), nb); };
    c.fill = [=] {
      dispatch(dtype, [&](auto tag) {
        fill_pattern<decltype(tag)>(full, r, 0);
        fill_value<decltype(tag)>(part, -1.f);
      });
    };
    c.check = [=] {
      int64_t w = 0;
      dispatch(dtype, [&](auto tag) {
        w = count_wrong<decltype(tag)>(
            part, [&](int64_t k) { return sumr + n * static_cast<double>((r * chunk + k) % 5); }, tol);
      });
      return w;
    };
  } else if (op == "all_gather") {
    c.run = [&comm, full, part, nb] { complete(comm.all_gather_async(part, full), nb); };
    c.fill = [=] {
      dispatch(dtype, [&](auto tag) {
        fill_pattern<decltype(tag)>(part, r, 0);
        fill_value<decltype(tag)>(full, -1.f);
      });
    };
    c.check = [=] {
      int64_t w = 0;
      dispatch(dtype, [&](auto tag) {
        w = count_wrong<decltype(tag)>(
            full, [&](int64_t i) { return static_cast<double>(pattern(static_cast<int>(i / chunk), i % chunk)); }, tol);
      });
      return w;
    };
  } else if (op == "all_to_all") {
    // nccl-tests' alltoall: every rank sends one chunk to each rank (itself included) from its input
    // of n chunks into its output of n chunks; equal counts here (the tests cover uneven ones).
    at::Tensor received = b.narrow(0, 0, chunk * n);
    const std::vector<int64_t> counts(n, chunk);
    c.run = [&comm, full, received, counts, nb] { complete(comm.all_to_all_async(full, received, counts, counts), nb); };
    c.clear = [full, received] {
      zero_bytes(full);
      zero_bytes(received);
    };
    c.fill = [=] {
      dispatch(dtype, [&](auto tag) {
        fill_pattern<decltype(tag)>(full, r, 0);
        fill_value<decltype(tag)>(received, -1.f);
      });
    };
    c.check = [=] {  // chunk i of the output is chunk r of rank i's input
      int64_t w = 0;
      dispatch(dtype, [&](auto tag) {
        w = count_wrong<decltype(tag)>(
            received,
            [&](int64_t i) { return static_cast<double>(pattern(static_cast<int>(i / chunk), r * chunk + i % chunk)); },
            tol);
      });
      return w;
    };
  } else {
    fail("bench comm: unknown operation '", op, "' (", comm_bench_ops(), ")");
  }
  return c;
}

// Per-rank value -> its mean (or sum) over ranks, through the communicator.
double over_ranks(comm::Communicator& comm, const at::Tensor& scratch, double v, bool mean) {
  scratch.fill_(v);
  comm.all_reduce(scratch);
  const double s = scratch.item<double>();
  return mean ? s / comm.size() : s;
}

MemcpyResult measure_memcpy(comm::Communicator& comm, const at::Tensor& src, const at::Tensor& dst, int iters,
                            const at::Tensor& scratch) {
  MemcpyResult m;
  m.bytes = src.numel() * src.element_size();
  m.iters = iters;
  const void* s = src.data_ptr();
  void* d = dst.data_ptr();
  double best = 0;
  auto copy_loop = [&] {  // mean seconds per copy; `best` gets the fastest single copy
    std::memcpy(d, s, m.bytes);  // warm-up
    best = 1e30;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      const auto t = Clock::now();
      std::memcpy(d, s, m.bytes);
      best = std::min(best, seconds_since(t));
    }
    return seconds_since(t0) / iters;
  };
  // Rank 0 alone: the ceiling one process can reach while its peers are idle.
  comm.barrier();
  double alone = comm.rank() == 0 ? copy_loop() : 0;
  comm.barrier();
  scratch.fill_(comm.rank() == 0 ? best : 0.0);
  comm.broadcast(scratch, 0);
  best = scratch.item<double>();
  scratch.fill_(alone);
  comm.broadcast(scratch, 0);
  alone = scratch.item<double>();
  m.time_us = alone * 1e6;
  m.gbps = m.bytes / alone / 1e9;
  m.traffic_gbps = 2 * m.gbps;
  m.best_gbps = m.bytes / best / 1e9;
  // Every rank at once: what the memory system gives each when all of them stream.
  comm.barrier();
  const double each = copy_loop();
  m.concurrent_gbps_total = over_ranks(comm, scratch, m.bytes / each / 1e9, false);
  m.concurrent_gbps_per_rank = m.concurrent_gbps_total / comm.size();
  return m;
}

// Row timings alternate between the collective and rank 0's memcpy of the same size, this many
// times (fewer when a row has fewer calls).
constexpr int kSegments = 5;

// memcpys of `bytes` in one segment: about 64 MiB copied, 2..200 copies.
int copies_per_segment(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>((int64_t(64) << 20) / std::max<int64_t>(bytes, 1), 2, 200));
}

// Seconds this rank spends on `copies` memcpys of `bytes` from src to dst, adding them to *count:
// on rank 0 alone while the other ranks wait (0 on them), or on every rank at once (`all`).
double copy_seconds_on(comm::Communicator& comm, bool all, const at::Tensor& src, const at::Tensor& dst,
                       int64_t bytes, int copies, int* count) {
  double t = 0;
  comm.barrier();
  if (all || comm.rank() == 0) {
    const auto t0 = Clock::now();
    for (int i = 0; i < copies; ++i) std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
    t = seconds_since(t0);
    *count += copies;
  }
  comm.barrier();
  return t;
}

std::string memcpy_line(const char* when, const MemcpyResult& m, int nranks) {
  return strf("# memcpy %s: %s x %d, rank 0 alone: %.1f us = %.2f GB/s copied (%.2f GB/s read+write; "
              "fastest copy %.2f GB/s); all %d ranks at once: %.2f GB/s per rank, %.2f GB/s total",
              when, format_bytes(m.bytes).c_str(), m.iters, m.time_us, m.gbps, m.traffic_gbps, m.best_gbps, nranks,
              m.concurrent_gbps_per_rank, m.concurrent_gbps_total);
}

const char* kRowFormat = "%12s  %12s  %8s  %6s  %6s  %6s  %10s  %7s  %7s  %7s  %6s";

std::string table_header() {
  std::string h1 = strf(kRowFormat, "size", "count", "type", "redop", "root", "iters", "time", "algbw", "busbw",
                        "busbw/", "#wrong");
  std::string h2 = strf(kRowFormat, "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "memcpy", "");
  h1[0] = '#';
  h2[0] = '#';
  while (!h2.empty() && h2.back() == ' ') h2.pop_back();
  return h1 + "\n" + h2;
}

std::string table_row(const CommBenchRow& row, const std::string& type_name) {
  const bool reduces = row.op == "all_reduce" || row.op == "reduce_scatter";
  return strf(kRowFormat, std::to_string(row.bytes).c_str(), std::to_string(row.count).c_str(), type_name.c_str(),
              reduces ? "sum" : "none", std::to_string(row.root).c_str(), std::to_string(row.iters).c_str(),
              strf("%.1f", row.time_us).c_str(), strf("%.3f", row.algbw_gbps).c_str(),
              strf("%.3f", row.busbw_gbps).c_str(), strf("%.3f", row.busbw_over_memcpy).c_str(),
              std::to_string(row.wrong).c_str());
}

const char* op_description(const std::string& op) {
  if (op == "all_reduce") return "in place; size = the buffer; busbw = algbw x 2(n-1)/n";
  if (op == "reduce_scatter") return "size = the input (n chunks), out of place; busbw = algbw x (n-1)/n";
  if (op == "all_gather") return "size = the output (n chunks), out of place; busbw = algbw x (n-1)/n";
  if (op == "all_to_all") return "size = the input (n chunks, one per rank), out of place; busbw = algbw x (n-1)/n";
  return "in place from root 0; size = the buffer; busbw = algbw";
}

}  // namespace

int auto_iters(int64_t bytes) {
  const int64_t budget = int64_t(1) << 30;
  return static_cast<int>(std::clamp<int64_t>(budget / std::max<int64_t>(bytes, 1), 5, 200));
}

const char* comm_bench_ops() { return "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all"; }

bool is_comm_bench_op(const std::string& op) {
  return op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" || op == "broadcast" || op == "all_to_all";
}

int auto_warmup(int iters) { return std::clamp(iters / 10, 1, 20); }

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  return 1.0;
}

int64_t CommBenchResult::wrong() const {
  int64_t w = 0;
  for (const auto& r : rows) w += r.wrong;
  return w;
}

namespace {

// The sizes of the sweep, min_bytes to max_bytes by factor, after checking the options.
std::vector<int64_t> sweep_sizes(const CommBenchOptions& opts, const CommBenchResult& res) {
  if (opts.min_bytes < res.element_size) fail("--min-bytes must be at least one element (", res.element_size, " B)");
  if (opts.max_bytes < opts.min_bytes) fail("--max-bytes (", opts.max_bytes, ") is below --min-bytes (", opts.min_bytes, ")");
  if (opts.factor < 2) fail("--factor must be at least 2");
  if (opts.max_bytes / res.element_size > INT_MAX)
    fail("--max-bytes ", opts.max_bytes, " is more than MPI's int count of ", res.dtype, " elements; use at most ",
         format_bytes(int64_t(INT_MAX) * res.element_size / (1 << 20) * (1 << 20)));
  std::vector<int64_t> sizes;
  for (int64_t s = opts.min_bytes; s <= opts.max_bytes; s *= opts.factor) {
    sizes.push_back(s);
    if (s > opts.max_bytes / opts.factor) break;
  }
  return sizes;
}

// The lines above the tables: who runs, the sweep, how time and bandwidth are measured.
void print_preamble(comm::Communicator& comm, const CommBenchOptions& opts, const CommBenchResult& res,
                    const std::vector<int64_t>& sizes, const std::function<void(const std::string&)>& print) {
  const int n = comm.size();
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  print(strf("# shardlm bench comm: %d rank%s (rank 0 on %s), communicator '%s', dtype %s (%lld B), %s .. %s x%lld",
             n, n == 1 ? "" : "s", host, comm.name().c_str(), res.type_name.c_str(),
             static_cast<long long>(res.element_size), format_bytes(sizes.front()).c_str(),
             format_bytes(sizes.back()).c_str(), static_cast<long long>(opts.factor)));
  print(strf("# iterations per size: %s; warmup: %s; time = mean over ranks of one call, after a barrier",
             opts.iters > 0 ? std::to_string(opts.iters).c_str() : "auto (about 1 GiB per row, 5..200)",
             opts.warmup >= 0 ? std::to_string(opts.warmup).c_str() : "auto (iters/10, 1..20)"));
  print(strf("# GB/s = 1e9 bytes/s. busbw/memcpy: bus bandwidth over the memcpy bandwidth of rank 0 alone at the "
             "row's size, timed in %d segments alternating with the row's calls", kSegments));
  if (opts.nonblocking) print("# calls: non-blocking (the _async form, completed by polling test())");
}

// One row of a table: the case checked once untimed, then timed in segments interleaved with the
// memcpy that gives the row its own ceiling.
CommBenchRow measure_row(comm::Communicator& comm, const CommBenchOptions& opts, const std::string& op,
                         int64_t requested, OpCase& c, const at::Tensor& a, const at::Tensor& b,
                         const at::Tensor& scratch, const at::Tensor& wrong_scratch) {
  const int n = comm.size();
  CommBenchRow row;
  row.op = op;
  row.requested_bytes = requested;
  row.bytes = c.bytes;
  row.count = c.count;
  row.root = c.root;
  row.iters = opts.iters > 0 ? opts.iters : auto_iters(c.bytes);
  row.warmup = opts.warmup >= 0 ? opts.warmup : auto_warmup(row.iters);
  row.factor = bus_factor(op, n);

  // Correctness once, untimed: known inputs, one call, compare; then back to zeros.
  c.fill();
  c.run();
  const int64_t local_wrong = c.check();
  wrong_scratch.fill_(local_wrong);
  comm.all_reduce(wrong_scratch);
  row.wrong = wrong_scratch.item<int64_t>();
  c.clear();

  for (int i = 0; i < row.warmup; ++i) c.run();
  // The calls run in a few segments, each right after rank 0 alone copies the row's size: the
  // memory bandwidth of a shared machine drifts by 2x within a minute, so the ceiling of a row
  // is measured interleaved with it, not once at the start.
  const int segments = std::min(row.iters, kSegments);
  double op_seconds = 0, copy_seconds = 0, shared_copy_seconds = 0;
  int copies = 0, shared_copies = 0;
  for (int s = 0; s < segments; ++s) {
    copy_seconds += copy_seconds_on(comm, false, a, b, c.bytes, copies_per_segment(c.bytes), &copies);
    shared_copy_seconds += copy_seconds_on(comm, true, a, b, c.bytes, copies_per_segment(c.bytes), &shared_copies);
    const int calls = row.iters * (s + 1) / segments - row.iters * s / segments;
    comm.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) c.run();
    op_seconds += seconds_since(t0);
  }
  const double mean = over_ranks(comm, scratch, op_seconds / row.iters, true);
  const double copy_mean = over_ranks(comm, scratch, comm.rank() == 0 ? copy_seconds / copies : 0, false);
  const double shared_gbps = over_ranks(comm, scratch, c.bytes * shared_copies / shared_copy_seconds / 1e9, true);

  row.time_us = mean * 1e6;
  row.algbw_gbps = row.bytes / mean / 1e9;
  row.busbw_gbps = row.algbw_gbps * row.factor;
  row.memcpy_gbps = row.bytes / copy_mean / 1e9;
  row.busbw_over_memcpy = row.busbw_gbps / row.memcpy_gbps;
  row.memcpy_share_gbps = shared_gbps;
  row.busbw_over_memcpy_share = row.busbw_gbps / shared_gbps;
  return row;
}

// Summary: busbw of every operation side by side, the peaks against the ceiling.
void print_summary(const CommBenchOptions& opts, const CommBenchResult& res, const std::vector<int64_t>& sizes,
                   const std::function<void(const std::string&)>& print) {
  const int n = res.nranks;
  print("#");
  print(memcpy_line("(again, at the end)", res.memcpy_after, n));
  print(strf("# busbw (GB/s) by size; memcpy at the start %.2f GB/s (each row's busbw/memcpy uses its own)",
             res.memcpy_ceiling_gbps));
  std::string head = strf("%12s", "size");
  head[0] = '#';
  for (const auto& op : opts.ops) head += strf("  %14s", op.c_str());
  print(head);
  std::map<std::pair<std::string, int64_t>, const CommBenchRow*> by;
  for (const auto& row : res.rows) by[{row.op, row.requested_bytes}] = &row;
  // One line per size, one column per operation: value(row), or "-" where the row was skipped.
  auto print_by_size = [&](double (*value)(const CommBenchRow&)) {
    for (int64_t s : sizes) {
      std::string line = strf("%12lld", static_cast<long long>(s));
      for (const auto& op : opts.ops) {
        auto it = by.find({op, s});
        line += it == by.end() ? strf("  %14s", "-") : strf("  %14.3f", value(*it->second));
      }
      print(line);
    }
  };
  print_by_size([](const CommBenchRow& row) { return row.busbw_gbps; });
  double sum_busbw = 0;
  for (const auto& op : opts.ops) {
    const CommBenchRow* best = nullptr;
    for (const auto& row : res.rows)
      if (row.op == op && (!best || row.busbw_gbps > best->busbw_gbps)) best = &row;
    if (best)
      print(strf("# peak %-14s busbw %7.3f GB/s = %.3f x memcpy, at %s", op.c_str(), best->busbw_gbps,
                 best->busbw_over_memcpy, format_bytes(best->bytes).c_str()));
  }
  // The same rows against each rank's share of the memory system when all ranks copy at once:
  // the ceiling of a collective in which every rank streams, and with more ranks than cores the
  // only fair one (a rank then has part of a core).
  print("# busbw / memcpy share (all ranks copying at once, per rank; timed with the row) by size");
  print(head);
  print_by_size([](const CommBenchRow& row) { return row.busbw_over_memcpy_share; });
  for (const auto& row : res.rows) sum_busbw += row.busbw_gbps;
  print(strf("# Out of bounds values : %lld %s", static_cast<long long>(res.wrong()), res.wrong() ? "FAILED" : "OK"));
  print(strf("# Avg bus bandwidth    : %g", res.rows.empty() ? 0.0 : sum_busbw / res.rows.size()));
  print(strf("# %s in all (without start-up)", util::format_duration(res.seconds).c_str()));
}

}  // namespace

CommBenchResult run_comm_bench(comm::Communicator& comm, const CommBenchOptions& opts,
                               const std::function<void(const std::string&)>& print) {
  const auto t_start = Clock::now();
  const int n = comm.size();
  CommBenchResult res;
  res.nranks = n;
  res.dtype = opts.dtype == at::kBFloat16 ? "bfloat16" : "float32";
  res.type_name = opts.dtype == at::kBFloat16 ? "bfloat16" : "float";
  res.element_size = c10::elementSize(opts.dtype);
  res.nonblocking = opts.nonblocking;
  const std::vector<int64_t> sizes = sweep_sizes(opts, res);
  const int64_t max_elems = sizes.back() / res.element_size;

  // Long-lived buffers for the largest size, touched now so that no page fault lands in a timing.
  const auto bopts = at::TensorOptions().dtype(opts.dtype);
  at::Tensor a = at::empty({max_elems}, bopts), b = at::empty({max_elems}, bopts);
  zero_bytes(a);
  zero_bytes(b);
  at::Tensor scratch = at::zeros({1}, at::kDouble);
  at::Tensor wrong_scratch = at::zeros({1}, at::kLong);

  print_preamble(comm, opts, res, sizes, print);
  const int memcpy_iters = std::max(10, opts.iters > 0 ? opts.iters : auto_iters(sizes.back()));
  res.memcpy_before = measure_memcpy(comm, a, b, memcpy_iters, scratch);
  res.memcpy_ceiling_gbps = res.memcpy_before.gbps;
  print(memcpy_line("(ceiling)", res.memcpy_before, n));

  for (const std::string& op : opts.ops) {
    print("#");
    print(strf("# %s: %s (factor %.3f for %d ranks)", op.c_str(), op_description(op), bus_factor(op, n), n));
    print(table_header());
    for (int64_t requested : sizes) {
      OpCase c = make_case(comm, op, requested, a, b, opts.dtype, opts.nonblocking);
      if (c.bytes == 0) {
        print(strf("# %s: %s is too small to give each of %d ranks a 16-byte chunk; skipped", op.c_str(),
                   format_bytes(requested).c_str(), n));
        continue;
      }
      CommBenchRow row = measure_row(comm, opts, op, requested, c, a, b, scratch, wrong_scratch);
      res.rows.push_back(row);
      print(table_row(row, res.type_name));
    }
  }

  res.memcpy_after = measure_memcpy(comm, a, b, memcpy_iters, scratch);
  res.seconds = seconds_since(t_start);

  print_summary(opts, res, sizes, print);
  return res;
}

nlohmann::json to_json(const CommBenchResult& r) {
  auto mj = [](const MemcpyResult& m) {
    return nlohmann::json{{"bytes", m.bytes},
                          {"iters", m.iters},
                          {"time_us", m.time_us},
                          {"gbps", m.gbps},
                          {"traffic_gbps", m.traffic_gbps},
                          {"best_gbps", m.best_gbps},
                          {"concurrent_gbps_per_rank", m.concurrent_gbps_per_rank},
                          {"concurrent_gbps_total", m.concurrent_gbps_total}};
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"op", row.op},
                    {"requested_bytes", row.requested_bytes},
                    {"size_bytes", row.bytes},
                    {"count", row.count},
                    {"type", r.type_name},
                    {"root", row.root},
                    {"iters", row.iters},
                    {"warmup", row.warmup},
                    {"time_us", row.time_us},
                    {"algbw_gbps", row.algbw_gbps},
                    {"busbw_gbps", row.busbw_gbps},
                    {"bus_factor", row.factor},
                    {"memcpy_gbps", row.memcpy_gbps},
                    {"memcpy_share_gbps", row.memcpy_share_gbps},
                    {"busbw_over_memcpy_share", row.busbw_over_memcpy_share},
                    {"busbw_over_memcpy", row.busbw_over_memcpy},
                    {"wrong", row.wrong}});
  return {{"nranks", r.nranks},
          {"dtype", r.dtype},
          {"nonblocking", r.nonblocking},
          {"type", r.type_name},
          {"element_size", r.element_size},
          {"units", {{"time", "us"}, {"bandwidth", "GB/s = 1e9 bytes/s"}}},
          {"memcpy", mj(r.memcpy_before)},
          {"memcpy_after", mj(r.memcpy_after)},
          {"memcpy_ceiling_gbps", r.memcpy_ceiling_gbps},
          {"wrong", r.wrong()},
          {"seconds", r.seconds},
          {"results", rows}};
}

int64_t parse_bytes(const std::string& s) {
  const double bytes = util::parse_bytes(s);
  if (!(bytes >= 1) || bytes > 1e15 || bytes != std::floor(bytes)) fail("'", s, "' is not a whole, positive number of bytes");
  return static_cast<int64_t>(bytes);
}

std::string format_bytes(int64_t b) { return util::format_bytes(static_cast<double>(b)); }

}  // namespace shardlm::observe
