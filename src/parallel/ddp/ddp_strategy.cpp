// See ddp_strategy.h.
#include "parallel/ddp/ddp_strategy.h"

#include <cmath>

#include "parallel/ddp/data_parallel.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

class DdpStrategy : public Strategy {
 public:
  DdpStrategy(model::Llama& model, const ParallelDims& dims, std::shared_ptr<TensorParallel> tp, int64_t bucket_bytes,
              const optim::AdamWOptions& adam)
      : model_(model), tp_(std::move(tp)) {
    std::vector<at::Tensor> params;
    for (const auto& p : model_.parameters()) params.push_back(p.tensor);
    ddp_ = std::make_unique<DataParallel>(params, dims.dp_comm, DdpOptions{bucket_bytes});
    std::vector<optim::Segment> segments;
    for (size_t i = 0; i < params.size(); ++i)
      segments.push_back({model_.parameters()[i].name, params[i], ddp_->grads()[i], params[i].dim() >= 2});
    optimizer_ = std::make_unique<optim::AdamW>(std::move(segments), adam);
    ddp_->broadcast_parameters();  // rank 0 of the data-parallel group decides the weights
  }

  std::string describe() const override {
    return (tp_ ? tp_->describe_prefix() : "") + std::to_string(ddp_->num_buckets()) + " DDP bucket(s)";
  }
  model::UnitHooks* forward_hooks() override { return nullptr; }
  void begin_micro_step(bool boundary) override { ddp_->prepare_backward(boundary); }
  void finish_gradients(double loss_scale) override {
    if (loss_scale != 1.0) fail("internal: DDP runs in fp32 and takes no loss scale");
    ddp_->finish_gradient_sync();
  }
  // Gradients are replicated over the data-parallel group after the all-reduce: the local sum is
  // the group's. Over tensor parallelism, shards add and replicated tensors count once.
  double grad_norm() override {
    if (!tp_) return std::sqrt(optim::local_grad_sum_of_squares(ddp_->grads()));
    return std::sqrt(tp_->sum_over_group(optim::local_grad_sum_of_squares(ddp_->grads(), &tp_->grad_norm_weights())));
  }
  void step(double grad_norm, double max_norm, double lr) override {
    optim::clip_grads(ddp_->grads(), grad_norm, max_norm);
    optimizer_->step(lr);
    ddp_->zero_grad();
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
    return tp_ ? tp_->unshard(model_.named_tensors()) : model_.named_tensors();
  }
  ModelStateMemory memory() const override {
    ModelStateMemory m;
    m.compute_params = model_.num_parameters() * model_.parameters()[0].tensor.element_size();
    m.gradients = ddp_->gradient_bytes();
    m.optimizer_states = optimizer_->state_bytes();
    return m;
  }
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const override {
    return tp_ ? tp_->extra_groups() : std::vector<std::pair<std::string, comm::CommPtr>>{};
  }
  // A TP shard under HF names cannot be saved as a whole-model checkpoint.
  optim::AdamW* replicated_optimizer() override { return tp_ ? nullptr : optimizer_.get(); }

 private:
  template <typename T>
  static T not_mixed_precision() {
    fail("internal: loss scaling needs a mixed-precision strategy (ZeRO engine), not DDP");
  }
  model::Llama& model_;
  std::shared_ptr<TensorParallel> tp_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<optim::AdamW> optimizer_;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp_strategy(model::Llama& model, const ParallelDims& dims,
                                            std::shared_ptr<TensorParallel> tp, int64_t bucket_bytes,
                                            const optim::AdamWOptions& adam) {
  return std::make_unique<DdpStrategy>(model, dims, std::move(tp), bucket_bytes, adam);
}

}  // namespace shardlm::parallel
