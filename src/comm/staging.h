// The tensors a backend actually hands to its library. A tensor already where the library works
// (CPU memory for MPI, the communicator's GPU for NCCL) is used as it is; any other gets a copy
// there — pinned when it is host memory for a GPU tensor — filled at launch when the library reads
// it, and copied back into the caller's tensor by finish() when the library wrote it. Both
// backends use this: MPI stages CUDA tensors through the host (Debian's OpenMPI cannot read GPU
// memory), NCCL stages small CPU values (a loss, a grad norm) through its GPU.
#pragma once
#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace shardlm::comm {

// Which way data flows between a caller's tensor and the library.
enum class Flow { In, Out, InOut };

class Staging {
 public:
  explicit Staging(c10::Device where) : where_(where) {}

  at::Tensor stage(const at::Tensor& t, Flow flow) {
    if (t.device() == where_) return used_.emplace_back(t);
    const auto options = t.options().device(where_).pinned_memory(where_.is_cpu() && t.is_cuda());
    auto copy = at::empty(t.sizes(), options);
    if (flow != Flow::Out) copy.copy_(t);
    if (flow != Flow::In) copy_back_.emplace_back(t, copy);
    copied_ = true;
    return used_.emplace_back(copy);
  }
  // Every tensor the library sees (the NCCL backend records its stream's use of each).
  const std::vector<at::Tensor>& used() const { return used_; }
  // Whether any tensor was copied (the NCCL backend then waits on the host for the copy back).
  bool copied() const { return copied_; }
  // Once the library's operation completed: results into the caller's tensors, copies released.
  void finish() {
    for (auto& [caller, copy] : copy_back_) caller.copy_(copy);
    copy_back_.clear();
    used_.clear();
  }

 private:
  c10::Device where_;
  std::vector<at::Tensor> used_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_;  // (caller's tensor, staged copy)
  bool copied_ = false;
};

}  // namespace shardlm::comm
