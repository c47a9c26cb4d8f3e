// See ddp_strategy.h.
#include "parallel/ddp/ddp_strategy.h"

#include <algorithm>
#include <cmath>

#include "parallel/ddp/data_parallel.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(model::Llama& model, const ParallelDims& dims, ModelSplit split, int64_t bucket_bytes,
              const optim::AdamWOptions& adam)
      : model_(model), split_(std::move(split)) {
    // Expert parallelism (expert_parallel.h): the expert slices get their own buckets over the ranks
    // holding the same experts (edp); the rest is all-reduced over the data-parallel group.
    std::vector<at::Tensor> params, dense, experts;
    std::vector<std::pair<bool, size_t>> where;  // per held parameter: (expert?, index in its DataParallel)
    for (size_t i = 0; i < model_.parameters().size(); ++i) {
      if (!split_.holds(i)) continue;
      held_.push_back(i);
      const auto& t = model_.parameters()[i].tensor;
      params.push_back(t);
      norm_weights_.push_back(split_.grad_norm_weight(i));
      auto& list = split_.is_expert(i) ? experts : dense;
      where.emplace_back(split_.is_expert(i), list.size());
      list.push_back(t);
    }
    ddp_ = std::make_unique<DataParallel>(dense, dims.dp_comm, DdpOptions{bucket_bytes});
    if (!experts.empty()) expert_ddp_ = std::make_unique<DataParallel>(experts, dims.edp_comm, DdpOptions{bucket_bytes});
    for (const auto& [expert, k] : where) grads_.push_back(expert ? expert_ddp_->grads()[k] : ddp_->grads()[k]);
    std::vector<optim::Segment> segments;
    for (size_t k = 0; k < params.size(); ++k) {
      const size_t i = held_[k];
      // An expert slice is the element range of its whole tensor that this rank holds (checkpoints).
      const std::string name = model_.parameters()[i].name +
                               (split_.is_expert(i) ? "@" + std::to_string(split_.ep->first_element(i)) : "");
      segments.push_back({name, params[k], grads_[k], params[k].dim() >= 2});
    }
    optimizer_ = std::make_unique<optim::AdamW>(std::move(segments), adam);
    ddp_->broadcast_parameters();  // rank 0 of the data-parallel group decides the weights
    if (expert_ddp_) expert_ddp_->broadcast_parameters();  // of the experts: edp rank 0
    dp_ = dims.dp_comm;
    edp_ = dims.edp_comm;
  }

  std::string describe() const override {
    return split_.describe_prefix() + std::to_string(ddp_->num_buckets()) + " DDP bucket(s)";
  }
  model::UnitHooks* forward_hooks() override { return nullptr; }
  std::vector<pp::StageUnits> stage_units() const override {
    return split_.pp ? split_.pp->units() : std::vector<pp::StageUnits>{{0, model_.units().size() - 1}};
  }
  void begin_micro_step(bool boundary) override {
    ddp_->prepare_backward(boundary);
    if (expert_ddp_) expert_ddp_->prepare_backward(boundary);
  }
  void finish_gradients(double loss_scale) override {
    if (loss_scale != 1.0) fail("internal: DDP runs in fp32 and takes no loss scale");
    ddp_->finish_gradient_sync();
    if (expert_ddp_) {
      // Averaged over edp; each owner's gradient already sums its EP group's rows, so the mean over
      // the data-parallel batch is the edp mean / ep (see expert_parallel.h).
      expert_ddp_->finish_gradient_sync();
      for (const auto& g : expert_ddp_->grads()) g.mul_(1.0 / split_.ep->size());
    }
    split_.finish([this] { return grads_[index_of(0)]; });
  }
  // Gradients are replicated over the data-parallel group after the all-reduce: the local sum is
  // the group's. The split adds TP shards and pipeline stages, each tensor counted once.
  double grad_norm() override {
    if (split_.whole()) return std::sqrt(optim::local_grad_sum_of_squares(grads_));
    return std::sqrt(split_.sum_over_model(optim::local_grad_sum_of_squares(grads_, &norm_weights_)));
  }
  void step(double grad_norm, double max_norm, double lr) override {
    optim::clip_grads(grads_, grad_norm, max_norm);
    optimizer_->step(lr);
    ddp_->zero_grad();
    if (expert_ddp_) expert_ddp_->zero_grad();
  }
  std::vector<UnitGradStats> unit_grad_stats() override { return not_mixed_precision<std::vector<UnitGradStats>>(); }
  void skip_step() override { not_mixed_precision<int>(); }
  void set_unit_loss_scales(std::vector<double>) override { not_mixed_precision<int>(); }
  std::vector<std::string> unit_names() const override {
    std::vector<std::string> names;
    for (const auto& u : model_.units()) names.push_back(u.name);
    return names;
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    return split_.whole() ? model_.named_tensors() : split_.gather(model_, model_.named_tensors());
  }
  ModelStateMemory memory() const override {
    ModelStateMemory m;
    m.compute_params = model_.num_parameters() * model_.parameters()[0].tensor.element_size();  // held (expert slices)
    m.gradients = ddp_->gradient_bytes() + (expert_ddp_ ? expert_ddp_->gradient_bytes() : 0);
    m.optimizer_states = optimizer_->state_bytes();
    return m;
  }
  // A TP shard or a pipeline stage under HF names cannot be saved as a whole-model checkpoint.
  optim::AdamW* replicated_optimizer() override { return split_.whole() ? optimizer_.get() : nullptr; }
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const override { return split_.extra_groups(); }
  // Whole parameters and their all-reduced gradients: replicated over the data-parallel group.
  std::vector<ReplicaSet> replicated_tensors(bool gradients) override {
    std::vector<std::pair<std::string, at::Tensor>> tensors(model_.parameters().size());
    for (size_t k = 0; k < held_.size(); ++k) {
      const auto& p = model_.parameters()[held_[k]];
      tensors[held_[k]] = {p.name, gradients ? grads_[k] : p.tensor};
    }
    return split_replica_sets(split_, dp_, tensors, /*data_parallel=*/true, edp_);
  }
  // The optimizer's segments are the parameters themselves: loading them is all there is. With
  // expert parallelism the first expert-data-parallel rank of each EP group saves (its experts once,
  // the replicated rest once per EP rank, alike).
  CheckpointView checkpoint_view() override {
    return {optimizer_.get(), {}, split_.ep ? edp_->rank() == 0 : dp_->rank() == 0, [this](int64_t optimizer_steps, int64_t) { optimizer_->set_steps_taken(optimizer_steps); }};
  }

 private:
  size_t index_of(size_t param) const {
    return static_cast<size_t>(std::find(held_.begin(), held_.end(), param) - held_.begin());
  }
  template <typename T>
  static T not_mixed_precision() {
    fail("internal: loss scaling needs a mixed-precision strategy (ZeRO engine), not DDP");
  }
  model::Llama& model_;
  ModelSplit split_;
  std::vector<size_t> held_;          // model parameter index of each DDP parameter
  std::vector<double> norm_weights_;  // per DDP parameter
  std::unique_ptr<DataParallel> ddp_;         // the parameters replicated over dp
  std::unique_ptr<DataParallel> expert_ddp_;  // expert slices over edp (expert parallelism), else null
  std::vector<at::Tensor> grads_;             // per held parameter, from either
  std::unique_ptr<optim::AdamW> optimizer_;
  comm::CommPtr dp_, edp_;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(model::Llama& model, const ParallelDims& dims, ModelSplit split,
                                            int64_t bucket_bytes, const optim::AdamWOptions& adam) {
  return std::make_unique<DdpStrategy>(model, dims, std::move(split), bucket_bytes, adam);
}

}  // namespace shardlm::parallel
