// See parallelize.h.
#include "parallel/parallelize.h"

#include <map>
#include <utility>

#include "parallel/context/context_parallel.h"
#include "parallel/ddp/ddp_strategy.h"
#include "parallel/expert/expert_zero.h"
#include "parallel/fault_injection.h"
#include "parallel/zero/sharded_frozen_base.h"
#include "parallel/zero/zero_strategy.h"
#include "util/error.h"

namespace shardlm::parallel {

namespace {

std::unique_ptr<Strategy> parallelize_strategy(model::Llama& model, const ParallelDims& dims,
                                               const ParallelizeOptions& o) {
  ModelSplit split;
  // Mixture-of-experts models (model/moe.h): the experts are ordinary parameters of their layer's
  // unit, so DDP, ZeRO 1-3 and the pipeline's stage split apply as they are; under tensor
  // parallelism the sparse block is replicated (tp_layout.h). transformers' load-balancing loss is
  // one product of means over every layer's router logits: its sums travel between the pipeline's
  // stages (stage_calls).
  // 1. Tensor parallelism: from here on the model holds this rank's shards.
  if (dims.tp > 1) {
    tp::check_tensor_parallel(model.config(), dims.tp, o.sequence_parallel, 0);
    split.tp = std::make_shared<TensorParallel>(model, dims.tp_comm, o.sequence_parallel);
  }
  // 1a. Context parallelism: attention over the whole sequence from this rank's chunks.
  if (dims.cp > 1) {
    const auto mode = context::parse_mode(o.context_mode);
    context::check_context_parallel(model.config(), dims.cp, mode, o.seq_len, dims.tp);
    model.set_context_attention(context::make_context_attention(dims.cp_comm, mode));
  }
  // 1b. Expert parallelism (expert/expert_parallel.h): this rank keeps E/ep experts of every sparse
  //     layer and the dispatch reaches the others; everything else stays replicated over ep.
  if (dims.expert_parallel()) split.ep = std::make_shared<ExpertParallel>(model, dims.ep_comm, dims.edp_comm, dims.dp);
  // 2. Activation checkpointing.
  model.set_recompute(o.recompute);
  // 3. Pipeline parallelism: this rank keeps its stage's units.
  //    Interleaved: v chunks per rank, the layers split evenly over the p·v virtual stages.
  //    zb_h1 defers each linear's weight product from B to W (schedule.h); under ZeRO-3 a unit's
  //    parameters are released after its B, its gradient reduce-scattered in W (zero_engine.cpp).
  //    (Activation checkpointing runs: the recomputation happens in B and defers into the same queue.)
  if (dims.pp > 1)
    split.pp = std::make_shared<PipelinePlacement>(
        model, dims.pp_comm,
        o.virtual_pipeline > 1
            ? std::vector<int64_t>(dims.pp * o.virtual_pipeline,
                                   model.config().num_hidden_layers / (dims.pp * o.virtual_pipeline))
            : pp::layer_counts(model.config(), dims.pp, o.pipeline_split),
        o.virtual_pipeline);
  // 4. Data parallelism over this position's data-parallel group.
  const auto dtype = o.zero.compute_dtype;
  if (o.zero.stage == 0 && (dtype == at::kFloat || dtype == at::kDouble)) {
    model.to(o.zero.device);
    return make_ddp_strategy(model, dims, std::move(split), o.ddp_bucket_bytes, o.adam);
  }
  // With expert parallelism, a second engine beside the first shards the experts over edp.
  if (split.ep) return make_expert_zero_strategy(model, dims, split, o.zero, o.adam);
  // 4a. ZeRO-3 with LoRA: the frozen base is sharded over the ZeRO (shard) group too and gathered per
  //     use, never stepped (zero/sharded_frozen_base.h); after tensor parallelism's split and the
  //     pipeline's release above, before the trainer moves the base to the device.
  if (o.zero.stage == 3) install_sharded_frozen_base(model, dims.shard_comm);
  return make_zero_strategy(model, dims, std::move(split), o.zero, o.adam);
}

// The load-balancing loss across pipeline stages (schedule.h's side messages). aux = E / rows^2 *
// sum_e F_e S_e over the sums [F, S, rows] of every sparse layer (model/moe.h); each virtual stage
// sends the running sums of the stages up to it on with its activations, and the last forms the loss
// from them (its own S with gradient). d aux / d S_e = E F_e / rows^2 for every stage's S, so the last
// stage sends g = loss_multiplier x router_aux_loss_coef x E F / rows^2 (the scaled loss's gradient)
// upstream with the activations' gradient and each earlier stage back-propagates <g, its sums>
// beside its output: only its own S carries a gradient.
void add_router_sums(pp::StageCalls& calls, const model::Llama& model, size_t chunks, double loss_multiplier) {
  // Each (micro-batch, chunk)'s running sums from its forward to its backward.
  auto sums = std::make_shared<std::map<std::pair<int64_t, int>, at::Tensor>>();
  calls.side_before_forward = [&model](int64_t, int, const at::Tensor& received) {
    model.set_router_sums_before(received);
  };
  calls.side_after_forward = [&model, sums](int64_t m, int chunk) {
    auto s = model.take_router_sums();
    if (at::GradMode::is_enabled()) (*sums)[{m, chunk}] = s;
    return s.detach();
  };
  const auto loss = calls.loss;
  const int last = static_cast<int>(chunks) - 1;
  calls.loss = [loss, &model, sums, last](int64_t m, const at::Tensor& logits) {
    auto out = loss(m, logits);
    if (at::GradMode::is_enabled()) (*sums)[{m, last}] = model.take_router_sums();
    return out;
  };
  const auto& cfg = model.config();
  const int64_t E = cfg.num_experts;
  const double factor = loss_multiplier * cfg.router_aux_loss_coef * static_cast<double>(E);
  calls.side_backward = [sums, E, factor](int64_t m, int chunk, const at::Tensor& received) {
    const auto it = sums->find({m, chunk});
    if (it == sums->end()) fail("pipeline: no load-balancing sums kept for micro-batch ", m, " (internal error)");
    const auto s = it->second;
    sums->erase(it);
    if (received.defined()) return std::make_pair((received * s).sum(), received);
    const auto t = s.detach();  // the last virtual stage: every stage's sums
    const auto rows = t.narrow(0, 2 * E, 1);
    auto g = at::zeros_like(t);
    g.narrow(0, E, E).copy_(t.narrow(0, 0, E) * factor / (rows * rows));
    return std::make_pair(at::Tensor(), g);
  };
}

}  // namespace

Parallelized parallelize(model::Llama& model, const ParallelDims& dims, const ParallelizeOptions& o) {
  Parallelized p;
  // Faults a test injected (fault_injection.h) enter here and nowhere else; none: the plain strategy.
  p.strategy = with_injected_faults(model, dims, [&](const ParallelDims& d) { return parallelize_strategy(model, d, o); });
  // 5. The step's schedule, over this position's pipeline group (one stage without pipelining).
  //    Between stages travel the hidden states [micro-batch, this rank's positions, hidden].
  const int64_t positions = o.seq_len / dims.cp / (o.sequence_parallel ? dims.tp : 1);
  p.schedule = std::make_unique<pp::Pipeline>(
      dims.pp_comm, o.pipeline_schedule, std::vector<int64_t>{o.micro_batch, positions, model.config().hidden_size},
      at::TensorOptions().dtype(o.zero.compute_dtype).device(o.zero.device), o.virtual_pipeline);
  const auto& cfg = model.config();
  if (dims.pp > 1 && cfg.is_moe() && cfg.output_router_logits)  // the load-balancing sums (model/moe.h)
    p.schedule->set_side_messages(2 * cfg.num_experts + 1,
                                  at::TensorOptions()
                                      .dtype(o.zero.compute_dtype == at::kDouble ? at::kDouble : at::kFloat)
                                      .device(o.zero.device));
  return p;
}

pp::StageCalls stage_calls(const model::Llama& model, Strategy& strategy,
                           std::function<data::DataLoader::Batch(int64_t)> batch, int64_t seq_len,
                           double loss_multiplier) {
  pp::StageCalls calls;
  // Set by begin() for the step (or evaluation) about to run.
  struct Step {
    bool fine_tuning = false;
    double scale = 0;  // fine-tuning: micro-batches x ranks / counted targets of the step
  };
  auto step = std::make_shared<Step>();
  calls.begin = [batch, step](int64_t micro) {
    const auto first = batch(0);
    step->fine_tuning = first.counted_all_ranks >= 0;
    if (!step->fine_tuning) return;
    int64_t counted = 0;
    for (int64_t m = 0; m < micro; ++m) counted += batch(m).counted_all_ranks;
    // A step without a counted target contributes 0 (prepare gives every sample one: its EOS).
    step->scale = counted > 0 ? static_cast<double>(micro * first.world) / static_cast<double>(counted) : 0.0;
  };
  // Every stage reads the micro-batch: the first needs its tokens, the last its targets, and with
  // packed samples every stage their positions and segments.
  const auto units = strategy.stage_units();
  calls.input = [batch](int64_t m) { return batch(m).inputs; };
  calls.forward = [&model, &strategy, units, seq_len, batch, step](int64_t m, int chunk, const at::Tensor& in) {
    model::Packing packing;
    if (step->fine_tuning) {
      const auto b = batch(m);
      packing = {b.positions, b.segments};
    }
    const auto& u = units.at(static_cast<size_t>(chunk));
    return model.forward_units(in, u.first, u.last, seq_len, strategy.forward_hooks(), packing);
  };
  calls.loss = [&model, batch, loss_multiplier, step](int64_t m, const at::Tensor& logits) {
    const auto b = batch(m);
    const auto loss = step->fine_tuning ? model.loss_sum(logits, b.targets) * step->scale : model.loss(logits, b.targets);
    return std::make_pair(loss * loss_multiplier, loss.detach());
  };
  calls.before_backward = [&strategy](int64_t, bool last) { strategy.begin_micro_step(last); };
  if (model.config().is_moe() && model.config().output_router_logits) add_router_sums(calls, model, units.size(), loss_multiplier);
  return calls;
}

}  // namespace shardlm::parallel
