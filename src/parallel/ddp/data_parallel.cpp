#include "parallel/ddp/data_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "parallel/grad_ready_hook.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {


}  // namespace

DataParallel::DataParallel(std::vector<at::Tensor> params, comm::CommPtr dp, DdpOptions options)
    : params_(std::move(params)), dp_(std::move(dp)) {
  if (options.bucket_bytes <= 0) fail("ddp.bucket_cap_mb must be positive");
  bucket_of_.assign(params_.size(), 0);
  // Reverse order: the last layers' gradients are produced first in backward.
  std::vector<std::vector<size_t>> groups(1);
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t b = params_[k].numel() * static_cast<int64_t>(params_[k].element_size());
    if (!groups.back().empty() && bytes + b > options.bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(k);
    bytes += b;
  }
  grads_.resize(params_.size());
  for (auto& group : groups) {
    int64_t numel = 0;
    for (size_t k : group) numel += params_[k].numel();
    Bucket bucket;
    bucket.flat = at::zeros({numel}, params_[group.front()].options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : group) {
      const int64_t n = params_[k].numel();
      grads_[k] = bucket.flat.narrow(0, offset, n).view(params_[k].sizes());
      params_[k].mutable_grad() = grads_[k];
      bucket_of_[k] = buckets_.size();
      offset += n;
    }
    bucket.params = group;
    buckets_.push_back(std::move(bucket));
  }
  for (size_t k = 0; k < params_.size(); ++k)
    on_gradient_ready(params_[k], [this, k] { on_grad_ready(k); }, accumulators_);
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_parameters() {
  if (dp_->size() == 1) return;
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    auto buf = p.detach().contiguous();
    dp_->broadcast(buf, 0);
    if (!buf.is_same(p)) p.detach().copy_(buf);
  }
}

void DataParallel::prepare_backward(bool sync) {
  sync_ = sync && dp_->size() > 1;
  next_launch_ = 0;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
}

void DataParallel::on_grad_ready(size_t param) {
  if (!sync_) return;
  Bucket& b = buckets_[bucket_of_[param]];
  if (b.pending == 0) fail("data parallel: gradient of parameter ", param, " arrived twice in one backward");
  if (--b.pending == 0) launch_ready_buckets();
  // Poll in-flight buckets: MPI advances non-blocking collectives only inside MPI calls.
  for (size_t i = 0; i < next_launch_; ++i) buckets_[i].work->test();
}

void DataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    buckets_[next_launch_].work = dp_->all_reduce_async(buckets_[next_launch_].flat);
    ++next_launch_;
  }
}

void DataParallel::finish_gradient_sync() {
  if (!sync_) return;
  // A parameter unused in this forward produced no gradient: its bucket still has to be reduced
  // (with the zeros/accumulated values it holds) so every rank issues the same collectives.
  for (auto& b : buckets_) b.pending = 0;
  launch_ready_buckets();
  const double inv = 1.0 / dp_->size();
  for (auto& b : buckets_) {
    b.work->wait();
    b.flat.mul_(inv);
  }
  sync_ = false;
}

void DataParallel::zero_grad() {
  for (auto& b : buckets_) b.flat.zero_();
}

int64_t DataParallel::gradient_bytes() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
  return n;
}

}  // namespace shardlm::parallel
