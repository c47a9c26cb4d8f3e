// `shardlm bench machine`: measures the rates the time model prices work at (machine_profile.h) on
// this machine, the way training runs: every rank of the job measures at once, with the trainer's
// threads per rank, and the profile keeps the mean over ranks.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "model/llama_config.h"
#include "plan/machine_profile.h"

namespace shardlm::plan {

struct MeasureOptions {
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  // Besides a fixed grid of shapes, the products of this model at micro_batch x seq_len tokens per
  // rank (tp: its tensor-parallel shards), and its attention shape.
  std::optional<model::LlamaConfig> model;
  int64_t micro_batch = 4, seq_len = 256;
  int tp = 1;
  bool grid = true;  // false: only the model's shapes (a quick profile for that model alone)
  double seconds_per_item = 0.2;  // timed work per GEMM shape / rate (after one untimed call)
  int64_t collective_max_bytes = 64 << 20;
  // The disk NVMe offload would use (a directory on it; empty: not measured): `disk_bytes` written and
  // read back per transfer size, in files of that size, through util::FileStore as the offload opens it.
  std::string disk_dir;
  std::vector<int64_t> disk_blocks = {256 << 10, 1 << 20, 4 << 20};
  int64_t disk_bytes = 128 << 20;
};

// util::FileStore's rewrite (in place, as the offload's steps rewrite their files) and read bandwidth in
// `dir` for files of `block` bytes, `bytes` in all, with
// the offload's threads (2) and up to 4 transfers in flight (state_offload.h's buffer_count); `rank`
// names the files, removed afterwards. `io_path` gets the path the store took (O_DIRECT or buffered).
// Then the offload step's pattern: each file read two ahead and rewritten once read (stream_bytes_per_s).
DiskRate measure_disk(const std::string& dir, int64_t block, int64_t bytes, int rank, std::string* io_path);

// Collective on `world` (every rank calls it); the collectives are measured when it has > 1 rank.
// `log` gets a line per measurement (rank 0's).
MachineProfile measure_machine(comm::Communicator& world, const MeasureOptions& options,
                               const std::function<void(const std::string&)>& log);

}  // namespace shardlm::plan
