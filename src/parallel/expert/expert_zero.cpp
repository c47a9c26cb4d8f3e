// See expert_zero.h.
#include "parallel/expert/expert_zero.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "parallel/zero/zero_strategy.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

// Both engines' hooks around every unit: the dense half first, the experts' outside it.
class BothHooks : public model::UnitHooks {
 public:
  BothHooks(model::UnitHooks* a, model::UnitHooks* b) : a_(a), b_(b) {}
  void before_unit(size_t u) override {
    a_->before_unit(u);
    b_->before_unit(u);
  }
  at::Tensor after_unit(size_t u, const at::Tensor& output) override { return b_->after_unit(u, a_->after_unit(u, output)); }

 private:
  model::UnitHooks *a_, *b_;
};

class ExpertZeroStrategy : public Strategy {
 public:
  ExpertZeroStrategy(std::unique_ptr<Strategy> dense, std::unique_ptr<Strategy> experts)
      : dense_(std::move(dense)), experts_(std::move(experts)) {
    auto* a = dense_->forward_hooks();
    auto* b = experts_->forward_hooks();
    if ((a == nullptr) != (b == nullptr)) fail("internal: the dense and expert ZeRO engines disagree on unit hooks");
    if (a) hooks_ = std::make_unique<BothHooks>(a, b);
  }
  std::string describe() const override { return dense_->describe() + " (experts sharded over their edp group)"; }
  // (The same signature as the interface's, whichever it is.)
  decltype(std::declval<const Strategy&>().stage_units()) stage_units() const override { return dense_->stage_units(); }
  model::UnitHooks* forward_hooks() override { return hooks_.get(); }
  void begin_micro_step(bool boundary) override {
    dense_->begin_micro_step(boundary);
    experts_->begin_micro_step(boundary);
  }
  void finish_gradients(double loss_scale) override {
    dense_->finish_gradients(loss_scale);
    experts_->finish_gradients(loss_scale);
  }
  double grad_norm() override {
    const double a = dense_->grad_norm(), b = experts_->grad_norm();
    return std::sqrt(a * a + b * b);
  }
  void step(double grad_norm, double max_norm, double lr) override {
    dense_->step(grad_norm, max_norm, lr);
    experts_->step(grad_norm, max_norm, lr);
  }
  std::vector<UnitGradStats> unit_grad_stats() override {
    auto a = dense_->unit_grad_stats();
    const auto b = experts_->unit_grad_stats();
    for (size_t u = 0; u < a.size() && u < b.size(); ++u) {
      a[u].overflow = a[u].overflow || b[u].overflow;
      a[u].max_abs = std::max(a[u].max_abs, b[u].max_abs);
    }
    return a;
  }
  void skip_step() override {
    dense_->skip_step();
    experts_->skip_step();
  }
  void set_unit_loss_scales(std::vector<double> scales) override {
    dense_->set_unit_loss_scales(scales);
    experts_->set_unit_loss_scales(std::move(scales));
  }
  std::vector<std::string> unit_names() const override { return dense_->unit_names(); }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    auto a = dense_->full_parameters();
    auto b = experts_->full_parameters();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i)
      if (a[i].first.empty()) a[i] = std::move(b[i]);
    return a;
  }
  ModelStateMemory memory() const override {
    auto a = dense_->memory();
    const auto b = experts_->memory();
    a.compute_params += b.compute_params;
    a.gradients += b.gradients;
    a.master_params += b.master_params;
    a.optimizer_states += b.optimizer_states;
    a.host += b.host;
    a.offloaded += b.offloaded;
    a.gathered_peak += b.gathered_peak;
    a.padding_elements += b.padding_elements;
    return a;
  }
  CheckpointView checkpoint_view() override {
    auto view = dense_->checkpoint_view();
    view.more.push_back(experts_->checkpoint_view());
    return view;
  }
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const override { return dense_->extra_groups(); }

 private:
  std::unique_ptr<Strategy> dense_, experts_;
  std::unique_ptr<BothHooks> hooks_;
};

}  // namespace

std::unique_ptr<Strategy> make_expert_zero_strategy(model::Llama& model, const ParallelDims& dims, const ModelSplit& split,
                                                    const ZeroOptions& options, const optim::AdamWOptions& adam) {
  if (!split.ep) fail("internal: make_expert_zero_strategy without expert parallelism");
  if (options.per_unit_loss_scaling)
    fail("fp16.per_unit_loss_scaling with expert parallelism (parallelism.expert_parallel = ", dims.ep,
         ") is not supported; use one loss scale (per_unit_loss_scaling false) or bf16");
  const size_t n = model.parameters().size();
  ZeroOptions dense = options, experts = options;
  dense.only_params.assign(n, 0);
  experts.only_params.assign(n, 0);
  experts.first_element.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    (split.is_expert(i) ? experts.only_params : dense.only_params)[i] = 1;
    experts.first_element[i] = split.ep->first_element(i);
  }
  experts.average_over = dims.dp;
  experts.replicas = nullptr;
  experts.offload_files = "expert_states";  // NVMe offload: both engines' files in one directory
  experts.offload_param_files = "expert_params";  // parameter offload too
  // The experts' data-parallel group is edp: the engine shards over (and stage 0 all-reduces over) it,
  // with hybrid sharding over its ranks in this replica, all-reduced across the replicas.
  ParallelDims over_edp = dims;
  over_edp.dp_comm = dims.edp_comm;
  over_edp.shard_comm = dims.eshard_comm ? dims.eshard_comm : dims.edp_comm;
  over_edp.replica_comm = dims.ereplica_comm;
  over_edp.dp = dims.edp_comm->size();
  over_edp.shard = over_edp.shard_comm->size();
  auto a = make_zero_strategy(model, dims, split, std::move(dense), adam);
  auto b = make_zero_strategy(model, over_edp, split, std::move(experts), adam);
  return std::make_unique<ExpertZeroStrategy>(std::move(a), std::move(b));
}

}  // namespace shardlm::parallel
