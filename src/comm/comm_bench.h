// `shardlm bench comm`: nccl-tests-style bandwidth of the Communicator's collectives over message
// sizes, next to the machine's memcpy bandwidth measured in the same run as the ceiling.
//
// Definitions follow nccl-tests (doc/PERFORMANCE.md):
// - size: all_reduce and broadcast: the buffer; reduce_scatter, all_gather and all_to_all: the full
//   buffer of N chunks (reduce_scatter's input, all_gather's output, all_to_all's input: one chunk
//   to each rank, equal counts), the chunk rounded down to 16 bytes;
// - time: mean over ranks of (wall time of `iters` back-to-back blocking calls) / iters, after
//   `warmup` untimed calls and a barrier;
// - algbw = size / time (GB/s = 1e9 bytes/s); busbw = algbw x factor, factor 2(n-1)/n for
//   all_reduce, (n-1)/n for reduce_scatter, all_gather and all_to_all, 1 for broadcast.
// Buffers are allocated once for the largest size, touched before any timing, and every size
// uses their prefix (as nccl-tests does); each op is checked once per size against the expected
// values (#wrong), outside the timed loop.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"

namespace shardlm::observe {

struct CommBenchOptions {
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = 256 << 20;
  int64_t factor = 4;           // size multiplier between rows
  int iters = 0;                // 0: by size (auto_iters)
  int warmup = -1;              // -1: by iteration count (auto_warmup)
  at::ScalarType dtype = at::kFloat;
  // Start each call with the _async form and complete it by polling test() (how the trainer
  // overlaps reductions with backward) instead of the blocking call.
  bool nonblocking = false;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"};
};

// The operations the benchmark knows, for --ops: "all_reduce, reduce_scatter, ..." and a test of one.
const char* comm_bench_ops();
bool is_comm_bench_op(const std::string& op);

// Default iterations for a message of `bytes`: about 1 GiB moved per row, between 5 and 200.
int auto_iters(int64_t bytes);
int auto_warmup(int iters);
// nccl-tests' bus-bandwidth factor of an operation on n ranks.
double bus_factor(const std::string& op, int n);

struct MemcpyResult {
  int64_t bytes = 0;
  int iters = 0;
  double time_us = 0;       // mean of `iters` memcpys of `bytes`, rank 0 alone (the others wait in a barrier)
  double gbps = 0;          // bytes copied / time
  double traffic_gbps = 0;  // read + write: 2 x gbps
  double best_gbps = 0;     // the fastest single copy (rank 0 alone)
  double concurrent_gbps_per_rank = 0;  // every rank copying at once: mean per rank
  double concurrent_gbps_total = 0;     // ... and their sum
};

struct CommBenchRow {
  std::string op;
  int64_t requested_bytes = 0;  // the nominal size of the row
  int64_t bytes = 0;            // nccl-tests' size (see above)
  int64_t count = 0;            // elements in `bytes`
  int root = -1;
  int iters = 0, warmup = 0;
  double time_us = 0, algbw_gbps = 0, busbw_gbps = 0, factor = 0;
  double memcpy_gbps = 0;        // rank 0's memcpy of `bytes`, timed interleaved with the row's calls
  double busbw_over_memcpy = 0;  // busbw / memcpy_gbps
  double memcpy_share_gbps = 0;        // every rank's memcpy of `bytes` at once, mean per rank (interleaved too)
  double busbw_over_memcpy_share = 0;  // busbw / memcpy_share_gbps
  int64_t wrong = 0;             // elements that differed from the expected result, all ranks
};

struct CommBenchResult {
  int nranks = 0;
  std::string dtype;      // "float32" | "bfloat16"
  std::string type_name;  // nccl-tests' name: "float" | "bfloat16"
  bool nonblocking = false;
  int64_t element_size = 0;
  MemcpyResult memcpy_before, memcpy_after;
  double memcpy_ceiling_gbps = 0;  // memcpy_before.gbps, for reference (each row has its own memcpy_gbps)
  std::vector<CommBenchRow> rows;
  double seconds = 0;
  int64_t wrong() const;
};

// Runs the benchmark on every rank of `comm` (collective: all ranks call it with the same
// options). `print` receives the table line by line as rows complete; only rank 0's calls print
// anything meaningful, so pass a printer that is a no-op on the others.
CommBenchResult run_comm_bench(comm::Communicator& comm, const CommBenchOptions& opts,
                               const std::function<void(const std::string&)>& print);

nlohmann::json to_json(const CommBenchResult& r);

// Parses "4096", "4K", "4KB", "4KiB", "16M", "1G" (K = 1024).
int64_t parse_bytes(const std::string& s);
std::string format_bytes(int64_t b);  // util::format_bytes: "4 KiB", "256 MiB"

}  // namespace shardlm::observe
