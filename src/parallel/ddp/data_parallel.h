// Data parallelism with PyTorch DDP's gradient bucketing: every parameter's .grad is a view into
// one of a few flat bucket buffers (filled in reverse parameter order, the order backward produces
// gradients). When the last gradient of a bucket has been accumulated during backward, the
// bucket's all-reduce starts at once, so communication overlaps the rest of backward. Buckets are
// launched in index order on every rank, so all ranks issue the same collectives in the same order.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shardlm::parallel {

struct DdpOptions {
  int64_t bucket_bytes = 25ll << 20;  // PyTorch DDP's bucket_cap_mb = 25
};

class DataParallel {
 public:
  // params: leaf tensors (requires_grad), in model order. dp: the data-parallel group.
  DataParallel(std::vector<at::Tensor> params, comm::CommPtr dp, DdpOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Makes every rank's parameters equal to rank 0's.
  void broadcast_parameters();
  // Call before each micro-step's backward. sync=false (micro-steps before the accumulation
  // boundary) only accumulates locally; sync=true all-reduces as buckets fill.
  void prepare_backward(bool sync);
  // After the boundary micro-step's backward: waits for every bucket, divides by the group size.
  void finish_gradient_sync();
  void zero_grad();

  const std::vector<at::Tensor>& grads() const { return grads_; }
  size_t num_buckets() const { return buckets_.size(); }
  int64_t gradient_bytes() const;

 private:
  struct Bucket {
    at::Tensor flat;
    std::vector<size_t> params;
    size_t pending = 0;
    comm::WorkPtr work;
  };
  void on_grad_ready(size_t param);
  void launch_ready_buckets();

  std::vector<at::Tensor> params_, grads_;
  std::vector<size_t> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps the hooked grad accumulators alive
  comm::CommPtr dp_;
  bool sync_ = false;
  size_t next_launch_ = 0;
};

}  // namespace shardlm::parallel
