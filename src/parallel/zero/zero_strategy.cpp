// See zero_strategy.h.
#include "parallel/zero/zero_strategy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "parallel/zero/zero_engine.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

const char* precision_name(at::ScalarType t) {
  return t == at::kBFloat16 ? "bf16" : t == at::kHalf ? "fp16 + loss scaling" : t == at::kDouble ? "fp64" : "fp32";
}

class ZeroStrategy : public Strategy {
 public:
  ZeroStrategy(model::Llama& model, const ParallelDims& dims, ModelSplit split, ZeroOptions options,
               const optim::AdamWOptions& adam)
      : model_(model), split_(std::move(split)), tp_(split_.tp), stage_(options.stage), dtype_(options.compute_dtype),
        units_(model.units().size()), only_params_(options.only_params) {
    if (!split_.whole())
      for (size_t i = 0; i < model.parameters().size(); ++i) options.grad_norm_weights.push_back(split_.grad_norm_weight(i));
    options.replicas = dims.replica_comm;  // hybrid sharding: the units are sharded over one shard group
    engine_ = std::make_unique<ZeroEngine>(model, dims.shard_comm, std::move(options), adam);
    dp_ = dims.dp_comm;
    shard_ = dims.shard_comm;
    replicas_ = dims.replica_comm;
  }

  std::string describe() const override {
    return split_.describe_prefix() + "ZeRO stage " + std::to_string(stage_) +
           (replicas_ ? " in shard groups of " + std::to_string(shard_->size()) + " x " +
                            std::to_string(replicas_->size()) + " replicas (hybrid)"
                      : "") +
           ", " + precision_name(dtype_) +
           (engine_->state_offload() ? "; " + engine_->state_offload()->describe() : "") +
           (engine_->state_transfers() ? "; " + engine_->state_transfers()->describe() : "") +
           (engine_->host_optimizer() ? "; " + engine_->host_optimizer()->describe() : "") +
           (engine_->parameters_apart()
                ? std::string("; parameter shards in host memory apart from the device") +
                      (engine_->param_offload() ? " (files through host bounce buffers)" : "") +
                      ", copied into the gather buffers inside the prefetch window"
                : "") +
           (engine_->param_offload() ? "; " + engine_->param_offload()->describe() : "");
  }
  std::vector<pp::StageUnits> stage_units() const override {
    return split_.pp ? split_.pp->units() : std::vector<pp::StageUnits>{{0, units_ - 1}};
  }
  model::UnitHooks* forward_hooks() override { return engine_->forward_hooks(); }
  void begin_micro_step(bool boundary) override { engine_->prepare_backward(boundary); }
  void finish_gradients(double loss_scale) override {
    engine_->finish_gradient_sync(loss_scale);
    // The embedding is unit 0; its shard has the same layout on the first and last stage.
    split_.finish([this] { return engine_->unit_gradient_shard(0); });
  }
  double grad_norm() override {
    const double dp_sum = engine_->grad_sum_of_squares();
    return std::sqrt(split_.sum_over_model(dp_sum));
  }
  void step(double grad_norm, double max_norm, double lr) override { engine_->step(grad_norm, max_norm, lr); }
  // Agreed over the data-parallel group by the engine, then over the tensor- and pipeline-parallel
  // groups: a peer that skips a step while the others update would leave the model out of step
  // (units another stage holds are empty here: finite, largest 0).
  std::vector<UnitGradStats> unit_grad_stats() override {
    auto stats = engine_->unit_grad_stats();
    if (split_.whole()) return stats;
    auto packed = at::zeros({2 * static_cast<int64_t>(stats.size())}, at::kDouble);
    for (size_t u = 0; u < stats.size(); ++u) {
      packed[2 * u] = stats[u].overflow ? 1.0 : 0.0;
      packed[2 * u + 1] = stats[u].max_abs;
    }
    if (tp_) tp_->group()->all_reduce(packed, comm::ReduceOp::Max);
    if (split_.pp) split_.pp->group()->all_reduce(packed, comm::ReduceOp::Max);
    for (size_t u = 0; u < stats.size(); ++u)
      stats[u] = {packed[2 * u].item<double>() > 0, packed[2 * u + 1].item<double>()};
    return stats;
  }
  void skip_step() override { engine_->skip_step(); }
  void set_unit_loss_scales(std::vector<double> scales) override { engine_->set_unit_loss_scales(std::move(scales)); }
  std::vector<std::string> unit_names() const override {
    std::vector<std::string> names;
    for (const auto& u : engine_->layout().units) names.push_back(u.name);
    return names;
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    auto local = engine_->gather_full_parameters();
    return split_.whole() ? local : split_.gather(model_, std::move(local), only_params_);
  }
  ModelStateMemory memory() const override { return engine_->memory(); }
  CheckpointView checkpoint_view() override {
    const bool saves = stage_ == 0 ? dp_->rank() == 0 : !replicas_ || replicas_->rank() == 0;
    engine_->page_in_states();  // NVMe offload: the states into memory while the checkpoint reads or loads them
    return {&engine_->optimizer(), engine_->segment_working_pieces(), saves,
            [this](int64_t optimizer_steps, int64_t steps) { engine_->masters_loaded(optimizer_steps, steps); },
            [this] { engine_->page_out_states(/*write=*/false); }};
  }
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const override { return split_.extra_groups(); }
  // Parameters: stages 0-2 hold them whole (all-gathered after the update), replicated over the
  // data-parallel group; stage 3 compares the units gathered from the shards. Gradients: stage 0's
  // are whole and replicated; stages 1-3 hold a shard, whose pieces of the TP-replicated tensors
  // (and of the tied embedding) sit at the same offsets on every TP rank (pipeline end).
  std::vector<ReplicaSet> replicated_tensors(bool gradients) override {
    const auto& params = model_.parameters();
    std::vector<std::pair<std::string, at::Tensor>> tensors(params.size());
    if (!gradients) {
      if (stage_ == 3) {
        auto full = engine_->gather_full_parameters();
        for (size_t i = 0; i < full.size() && i < tensors.size(); ++i) tensors[i] = full[i];
      } else {
        for (size_t i = 0; i < params.size(); ++i) tensors[i] = {params[i].name, params[i].tensor};
      }
      return split_replica_sets(split_, dp_, tensors, /*data_parallel=*/true);
    }
    const auto& layout = engine_->layout();
    const bool whole = layout.dp_size == 1;
    const int64_t shard = whole ? 0 : shard_->rank();
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const auto& fu = layout.units[u];
      const int64_t lo = shard * fu.shard_numel, hi = lo + fu.shard_numel;
      for (const auto& fp : fu.params) {
        const int64_t a = std::max(lo, fp.offset), b = std::min(hi, fp.offset + fp.numel);
        if (a >= b) continue;
        const std::string range = "[elements " + std::to_string(a - fp.offset) + ".." + std::to_string(b - fp.offset) + ")";
        tensors[fp.param_index] = {fp.name + (whole ? "" : range), engine_->unit_gradient_shard(u).narrow(0, a - lo, b - a)};
      }
    }
    // Hybrid sharding: each shard is replicated over the replica group.
    return split_replica_sets(split_, replicas_ ? replicas_ : dp_, tensors, /*data_parallel=*/whole || replicas_);
  }

 private:
  model::Llama& model_;
  ModelSplit split_;
  std::shared_ptr<TensorParallel> tp_;
  int stage_;
  at::ScalarType dtype_;
  size_t units_;
  std::vector<char> only_params_;  // the parameters this engine packs (empty: all; expert_zero.h)
  std::unique_ptr<ZeroEngine> engine_;
  comm::CommPtr dp_, shard_, replicas_;  // replicas_: hybrid sharding only
};

}  // namespace

std::unique_ptr<Strategy> make_zero_strategy(model::Llama& model, const ParallelDims& dims, ModelSplit split,
                                             ZeroOptions options, const optim::AdamWOptions& adam) {
  return std::make_unique<ZeroStrategy>(model, dims, std::move(split), std::move(options), adam);
}

}  // namespace shardlm::parallel
