// What the time model (time_model.h) knows of a machine: rates measured by `shardlm bench machine`
// (plan/measure_machine.h) and kept as JSON, so that `shardlm plan --machine FILE` predicts seconds
// for a machine it is not running on. Every rate is what one rank sees while the others run the
// same work (ranks share memory bandwidth and cores), measured with the threads per rank given.
//   gemm:       at::mm rates by dtype and shape (m x k times k x n); a product of another shape takes
//               the rate of the nearest measured one (log distance over m, n, k);
//   attention:  the fused kernel's (scaled_dot_product_attention, causal) forward and backward, as
//               forward FLOPs per second (4 s_eff s d heads per sequence, s_eff = (s+1)/2 causal);
//   stream:     bytes per second of an elementwise op (read two, write one), what norms, activations,
//               casts and the loss cost;
//   optimizer:  fp32 elements per second of shardlm's AdamW step (optim/adamw.h), and the same with
//               compact moments (optimizer.state_precision bf16 / 8bit) where measured (else the fp32 rate);
//   disk:       util::FileStore's (O_DIRECT) write and read bandwidth in the directory NVMe offload
//               would use, by transfer size, with the store's threads and transfers in flight as the
//               offload runs them (`bench machine --disk DIR`); what optimizer-state and parameter
//               offload to NVMe cost. Absent in profiles written before it: the time model then
//               refuses to price NVMe offload, naming the field and the command;
//   host link:  device<->host copy bandwidth and the host's AdamW rate, what CPU optimizer offload on a
//               GPU costs (ZeRO-Offload); 0 = not measured (a CPU machine has no link: its optimizer
//               already runs on the host, so CPU offload is never a candidate there);
//   collectives: nccl-tests bus bandwidth and per-call time by operation and message size on
//               `ranks` ranks (comm/comm_bench.h); a message between two measured sizes is
//               interpolated, beyond them extrapolated by the nearest bandwidth;
//   overlap:    the fraction of a collective's time that can hide under compute running at the same
//               time: 0 on a CPU (the host's cores do the reduction work, host-polled MPI), 1 where a
//               device computes while links move data (CUDA streams, NCCL).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm::plan {

struct GemmRate {
  std::string dtype;  // "fp32" | "bf16" | "fp16"
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

struct CollectiveRate {
  std::string op;  // all_reduce | reduce_scatter | all_gather | broadcast | p2p
  int64_t bytes = 0;  // nccl-tests' size (reduce_scatter / all_gather: the full buffer)
  double busbw = 0;   // bytes per second
  double time_s = 0;  // one call
};

// One transfer size of the disk measurement: bytes per second of a stream of `block_bytes` files.
struct DiskRate {
  int64_t block_bytes = 0;
  double write_bytes_per_s = 0, read_bytes_per_s = 0;
  // Bytes moved (read + rewritten) per second when each file is read two ahead while the one before is
  // rewritten: the state offload's step (state_offload.h). 0: not measured (read and write then add).
  double stream_bytes_per_s = 0;
};

struct MachineProfile {
  std::string description;  // CPU model / device, cores, how it was measured
  std::string device = "cpu";
  int threads = 1;          // libtorch threads per rank during the measurement
  int ranks = 1;            // ranks that ran at once
  std::vector<GemmRate> gemm;
  std::map<std::string, double> attention_forward, attention_backward;  // dtype -> forward FLOPs / s
  double stream_bytes_per_s = 0;
  double optimizer_elements_per_s = 0;
  std::map<std::string, double> optimizer_state_elements_per_s;  // "bf16" | "8bit" -> elements / s
  std::string disk_dir, disk_io_path;  // where the disk was measured, and the path the store took there
  std::vector<DiskRate> disk;          // empty: not measured
  double host_link_bytes_per_s = 0, host_optimizer_elements_per_s = 0;  // 0: not measured
  std::vector<CollectiveRate> collectives;
  double overlap = 0;

  // The rate of an m x k by k x n product in `dtype`: the nearest measured shape of that dtype
  // (fp16 falls back to bf16's when not measured). Fails when the dtype was not measured at all.
  double gemm_rate(const std::string& dtype, int64_t m, int64_t n, int64_t k) const;
  // The highest measured GEMM rate of `dtype`: the peak MFU is measured against.
  double gemm_peak(const std::string& dtype) const;
  double attention_rate(const std::string& dtype, bool backward) const;
  // Seconds of one `op` call moving `bytes` (nccl-tests' size) over `ranks` ranks: the measured
  // per-call time interpolated in size (log-log), scaled by bus factor when `ranks` differs from
  // the profile's. 0 when ranks <= 1.
  double collective_seconds(const std::string& op, double bytes, int ranks) const;
  bool has_collectives() const { return !collectives.empty(); }
  // AdamW elements per second with moments kept as `state_precision` (fp32 | bf16 | 8bit).
  double optimizer_rate(const std::string& state_precision) const;
  // Seconds to write (or read) `bytes` in transfers of `block_bytes` each, at the rate of the nearest
  // measured transfer size (log distance). Fails naming disk_write_bytes_per_s / disk_read_bytes_per_s
  // and `shardlm bench machine --disk DIR` when the profile has no disk measurement.
  double disk_seconds(double bytes, double block_bytes, bool write) const;
  // Seconds to read `bytes` and rewrite them, interleaved as the offload's step does: at the nearest
  // transfer size's stream rate where measured, else its read and write seconds added.
  double disk_stream_seconds(double bytes, double block_bytes) const;
  // Fails naming the field and the command that measures it when `value` is not positive.
  static double require(double value, const char* field, const char* measure);
};

nlohmann::json to_json(const MachineProfile& p);
MachineProfile machine_profile_from_json(const nlohmann::json& j);
MachineProfile read_machine_profile(const std::string& path);
// nccl-tests' bus factor of an operation on n ranks: 2(n-1)/n all_reduce, (n-1)/n reduce_scatter and
// all_gather, 1 broadcast and p2p.
double collective_bus_factor(const std::string& op, int n);

}  // namespace shardlm::plan
