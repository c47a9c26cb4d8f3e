// ZeRO-Offload's optimizer half (zero_optimization.offload_optimizer.device "cpu" on a CUDA run):
// this rank's master shard (fp32, or bf16 with optimizer.master_precision "bf16": then also Kahan's
// bf16 compensation, per piece like the moments) and Adam moments live in host memory (pinned when the device is a
// GPU, so copies run asynchronously), and the step runs on the CPU. Per chunk of the shard, the
// gradient is copied device->host, the CPU steps the chunk (at::parallel_for over its pieces, each
// through optim::AdamW::step_pieces, so every element gets the in-memory update's arithmetic bit for
// bit), and the updated parameters go back host->device. The copies overlap the CPU: chunk k+1's
// gradient copy is queued before chunk k steps, and chunk k's copy-back runs while chunk k+1 steps.
//
// The device side sits behind OffloadTransfers, so the same scheduling code runs with a GPU's side
// streams and events (make_offload_transfers for a CUDA device) or with plain synchronous CPU copies
// (a CPU device, and the unit tests' recording fake).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

#include "optim/adamw.h"

namespace shardlm::parallel {

// Copies between device tensors and host memory, in the order the calls come, chunk by chunk.
class OffloadTransfers {
 public:
  virtual ~OffloadTransfers() = default;
  virtual bool pinned() const = 0;  // host buffers must be page-locked (asynchronous copies)
  virtual void begin() = 0;  // copies queued from here on follow the device work queued so far (the gradients)
  virtual void to_host(size_t chunk, const at::Tensor& host, const at::Tensor& device) = 0;
  virtual void grads_queued(size_t chunk) = 0;  // every to_host of `chunk` has been issued
  virtual void wait_grads(size_t chunk) = 0;    // the host blocks until they have landed
  virtual void to_device(size_t chunk, const at::Tensor& device, const at::Tensor& host) = 0;
  // The device's compute stream waits for every copy-back, and the host until they are done (its
  // buffers may change in the next step).
  virtual void finish() = 0;
};

// Side streams and events on a GPU; synchronous copies for a CPU device.
std::unique_ptr<OffloadTransfers> make_offload_transfers(c10::Device device);

// A 1-D host buffer of n elements, page-locked when `pinned` (the host side of asynchronous copies).
at::Tensor host_buffer(int64_t n, at::ScalarType dtype, bool pinned);

// One segment of the rank's shard.
struct HostShard {
  optim::Segment segment;   // name, decay, param_offset/param_numel; param: the fp32 master's initial
                            // values (copied to host), grad: ignored
  at::Tensor device_param;  // 1-D; the updated master is cast into it (any dtype)
  at::Tensor device_grad;   // 1-D, same numel; the reduced gradient (any dtype)
  // Optional: the host buffer (device_param's dtype and numel) the cast parameters wait in for their
  // copy up, when the caller counts it among its own buffers; undefined: allocated here where the
  // dtypes differ, the master itself where they match.
  at::Tensor host_stage;
};

// Elements [begin, begin + numel) of one optimizer segment: the unit a chunk's copies move.
struct OffloadPiece {
  size_t segment;
  int64_t begin, numel;
};

// The device side of a chunked host step, shared by HostOptimizer::step and the NVMe step of a GPU
// run (zero_engine.cpp, whose masters and moments stream from files through state_offload.h's
// chunks): per chunk, its gradient pieces come down into host buffers (chunk k+1's queued before
// chunk k steps) and its updated pieces, cast into staging buffers, go up while the next chunk steps.
class ChunkTransfers {
 public:
  // Per segment: the device tensors (shards[i].device_param/device_grad), the host gradient buffer
  // the optimizer reads and the staging buffer the cast parameters go up from (device_param's dtype;
  // may be the master itself). A piece whose host gradient is the device's own memory is not copied.
  ChunkTransfers(std::vector<HostShard> shards, std::vector<at::Tensor> host_grads, std::vector<at::Tensor> stages,
                 std::unique_ptr<OffloadTransfers> transfers, std::vector<std::vector<OffloadPiece>> chunks);
  // Starts a step; all_first: every chunk's gradient is queued and has landed on return (8-bit blocks
  // shared between ranks need every gradient before any piece steps), else chunk 0's is queued.
  void begin(bool all_first);
  void gradients(size_t k);  // chunk k's gradients have landed on return; chunk k+1's are queued
  // The updated master elements of piece `p` (chunk k) into its staging buffer (unless that is the
  // master), then (send) queued for the copy up.
  void cast(const OffloadPiece& p, const at::Tensor& master) const;
  void send(size_t k, const OffloadPiece& p);
  void finish();  // every copy up has landed
  const std::vector<std::vector<OffloadPiece>>& chunks() const { return chunks_; }
  bool pinned() const { return transfers_->pinned(); }
  bool copies() const { return apart_; }  // some host buffer is not the device's own memory
  std::string describe() const;           // how the copies run, for the log

 private:
  void queue(size_t k);
  std::vector<HostShard> shards_;
  std::vector<at::Tensor> grad_, stage_;
  std::unique_ptr<OffloadTransfers> transfers_;
  std::vector<std::vector<OffloadPiece>> chunks_;
  bool apart_ = false;
  size_t queued_ = 0;
};

struct HostOptimizerOptions {
  int64_t chunk_elements = int64_t{1} << 22;  // elements per transfer unit (DeepSpeed's sub_group_size)
  int64_t piece_elements = int64_t{1} << 16;  // elements per CPU task inside a chunk
};

class HostOptimizer {
 public:
  HostOptimizer(std::vector<HostShard> shards, optim::AdamWOptions options,
                std::unique_ptr<OffloadTransfers> transfers, HostOptimizerOptions opts = {});
  // The engine's optimizer, shared (checkpoints save and load the same state): its segments' params
  // are already the host masters and its grads the host gradient buffers, used in place. shards[i]
  // matches adam.segments()[i] (its segment.param is ignored). Where a device tensor is the host
  // tensor itself (a CPU run: the gradient view; an fp32 shard that is its master) no copy is made;
  // where they are apart (a GPU run, or a CPU run keeping the GPU layout) every chunk is copied.
  HostOptimizer(optim::AdamW& adam, std::vector<HostShard> shards, std::unique_ptr<OffloadTransfers> transfers,
                HostOptimizerOptions opts = {});
  // One update: gradients in, parameters out, as described above. grad_multipliers as AdamW::step.
  void step(double lr, const std::vector<double>* grad_multipliers = nullptr);

  optim::AdamW& adam() { return *adam_; }  // the host states (checkpoints, shared 8-bit blocks)
  const at::Tensor& master(size_t i) const { return master_[i]; }
  size_t chunks() const { return moves_->chunks().size(); }
  std::string describe() const;  // the run's log line
  // Host bytes: masters, moments, and the gradient and parameter staging buffers.
  int64_t host_bytes() const;
  int64_t staging_bytes() const;

 private:
  std::vector<HostShard> shards_;
  std::vector<at::Tensor> master_, grad_, stage_;  // stage_: the device_param dtype; == master_ for fp32
  // stage_ buffers and the chunks, once masters are set: moves_ from the transfers.
  void plan_chunks(const HostOptimizerOptions& opts, std::unique_ptr<OffloadTransfers> transfers);
  std::unique_ptr<optim::AdamW> own_adam_;  // null when the engine's optimizer is shared
  optim::AdamW* adam_ = nullptr;
  std::unique_ptr<ChunkTransfers> moves_;
};

}  // namespace shardlm::parallel
