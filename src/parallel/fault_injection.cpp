// The decorators that inject a test's faults (fault_injection.h) from outside the engines: a
// communicator that delays this rank's all-gathers, unit hooks that attenuate one unit's backward
// signal, and a Strategy that poisons a gradient shard before the overflow check and nudges a
// replicated tensor before the consistency check. They exist so that the production paths (the
// ZeRO engine, the consistency check) carry no test-only branches; parallelize() installs them,
// and only when a test injected something. A communicator that breaks the order of collectives
// (a skipped call, a call with another size) serves the flight recorder's end-to-end test.
#include "parallel/fault_injection.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/flight_recorder.h"
#include "comm/timeout_report.h"
#include "optim/adamw.h"
#include "parallel/scale_gradient.h"
#include "util/error.h"

namespace shardlm::parallel {
namespace {

// Sleeps `ms` before every all-gather it starts; everything else (and the stats) is the inner
// communicator's.
class DelayingCommunicator : public comm::Communicator {
 public:
  DelayingCommunicator(comm::CommPtr inner, int ms) : inner_(std::move(inner)), ms_(ms) {
    set_timeout_seconds(inner_->timeout_seconds());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  comm::WorkPtr all_reduce_async(const at::Tensor& t, comm::ReduceOp op) override { return inner_->all_reduce_async(t, op); }
  comm::WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, comm::ReduceOp op) override {
    return inner_->reduce_scatter_async(in, out, op);
  }
  comm::WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return inner_->all_gather_async(in, out);
  }
  comm::WorkPtr broadcast_async(const at::Tensor& t, int root) override { return inner_->broadcast_async(t, root); }
  comm::WorkPtr send_async(const at::Tensor& t, int dst, int tag) override { return inner_->send_async(t, dst, tag); }
  comm::WorkPtr recv_async(const at::Tensor& t, int src, int tag) override { return inner_->recv_async(t, src, tag); }
  comm::WorkPtr barrier_async() override { return inner_->barrier_async(); }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return std::make_shared<DelayingCommunicator>(inner_->split(color, key, name), ms_);
  }
  const std::map<std::string, comm::OpStats>& stats() const override { return inner_->stats(); }
  void reset_stats() override { inner_->reset_stats(); }

 private:
  comm::CommPtr inner_;
  int ms_;
};

// A Work that is already complete: what a skipped collective returns (its tensors untouched).
class SkippedWork : public comm::Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// Breaks the order of collectives on this rank's data-parallel communicator once (FaultInjection's
// desync fields): skips the chosen collective, or issues it on the first half of its elements; then
// holds in the mismatched call (see hold()). Point-to-point calls and split() pass through.
class DesyncingCommunicator : public comm::Communicator {
 public:
  DesyncingCommunicator(comm::CommPtr inner, const FaultInjection& f) : inner_(std::move(inner)), f_(f) {
    set_timeout_seconds(inner_->timeout_seconds());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  comm::WorkPtr all_reduce_async(const at::Tensor& t, comm::ReduceOp op) override {
    switch (next()) {
      case Act::Pass: return inner_->all_reduce_async(t, op);
      case Act::Skip: return skipped();
      case Act::Short: hold(inner_->all_reduce_async(half(t), op));
      case Act::Hold: hold(inner_->all_reduce_async(t, op));
    }
    return nullptr;
  }
  comm::WorkPtr reduce_scatter_async(const at::Tensor& in, const at::Tensor& out, comm::ReduceOp op) override {
    switch (next()) {
      case Act::Pass: return inner_->reduce_scatter_async(in, out, op);
      case Act::Skip: return skipped();
      case Act::Short: {  // each rank's chunk halved: input size x h, output h
        const int64_t h = std::max<int64_t>(1, out.numel() / 2);
        hold(inner_->reduce_scatter_async(in.view({-1}).narrow(0, 0, h * size()), out.view({-1}).narrow(0, 0, h), op));
      }
      case Act::Hold: hold(inner_->reduce_scatter_async(in, out, op));
    }
    return nullptr;
  }
  comm::WorkPtr all_gather_async(const at::Tensor& in, const at::Tensor& out) override {
    switch (next()) {
      case Act::Pass: return inner_->all_gather_async(in, out);
      case Act::Skip: return skipped();
      case Act::Short: {  // input h, output size x h
        const int64_t h = std::max<int64_t>(1, in.numel() / 2);
        hold(inner_->all_gather_async(in.view({-1}).narrow(0, 0, h), out.view({-1}).narrow(0, 0, h * size())));
      }
      case Act::Hold: hold(inner_->all_gather_async(in, out));
    }
    return nullptr;
  }
  comm::WorkPtr broadcast_async(const at::Tensor& t, int root) override {
    switch (next()) {
      case Act::Pass: return inner_->broadcast_async(t, root);
      case Act::Skip: return skipped();
      case Act::Short: hold(inner_->broadcast_async(half(t), root));
      case Act::Hold: hold(inner_->broadcast_async(t, root));
    }
    return nullptr;
  }
  comm::WorkPtr barrier_async() override {
    switch (next()) {
      case Act::Pass: return inner_->barrier_async();
      case Act::Skip: return skipped();
      case Act::Short:  // a barrier has no size: it is issued as it is
      case Act::Hold: hold(inner_->barrier_async());
    }
    return nullptr;
  }
  comm::WorkPtr send_async(const at::Tensor& t, int dst, int tag) override { return inner_->send_async(t, dst, tag); }
  comm::WorkPtr recv_async(const at::Tensor& t, int src, int tag) override { return inner_->recv_async(t, src, tag); }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return inner_->split(color, key, name);
  }
  const std::map<std::string, comm::OpStats>& stats() const override { return inner_->stats(); }
  void reset_stats() override { inner_->reset_stats(); }

 private:
  enum class Act { Pass, Skip, Short, Hold };
  // What to do with the collective being issued now.
  Act next() {
    if (skipped_) return Act::Hold;  // the call after the skipped one
    if (done_) return Act::Pass;
    if (!f_.desync_phase.empty() && comm::FlightContext::current().find(f_.desync_phase) == std::string::npos)
      return Act::Pass;
    if (++seen_ < f_.desync_occurrence) return Act::Pass;
    done_ = true;
    if (f_.desync_kind == "skip") {
      skipped_ = true;
      return Act::Skip;
    }
    return Act::Short;
  }
  comm::WorkPtr skipped() { return std::make_shared<SkippedWork>(); }
  at::Tensor half(const at::Tensor& t) { return t.view({-1}).narrow(0, 0, std::max<int64_t>(1, t.numel() / 2)); }
  // The rank waits in its mismatched call and never completes it (it is not progressed: on the
  // shared-memory path progressing it would pair it with the peers' call and return wrong numbers).
  // The peers time out and ask every rank for its flight record, which this rank's watcher thread
  // writes; mpirun then ends the job. Should nobody end it, the rank writes its record and exits
  // as a timed-out rank does, after the peers' timeout and a margin.
  [[noreturn]] void hold(comm::WorkPtr in_flight) {
    held_ = std::move(in_flight);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds() + 60);
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comm::flight_recorder().dump("injected desync: held in a mismatched collective on '" + name() + "'");
    std::_Exit(comm::kCommFailureExitCode);
  }

  comm::CommPtr inner_;
  FaultInjection f_;
  int seen_ = 0;
  bool done_ = false, skipped_ = false;
  comm::WorkPtr held_;
};

// The strategy's own hooks (if any) with one unit's output attenuated. Under per-unit loss scaling
// the strategy's own op on that output would move the backward signal from the scale of the unit
// above to this unit's: the attenuation must happen in that same multiplication, or a tiny signal
// is rounded to zero (attenuated first, at the upper unit's scale) or the unattenuated one
// overflows (rescaled first, at this unit's larger scale). So FaultInjectingStrategy gives the
// strategy scales under which that boundary's ratio is 1 (its op is then left out) and this op
// multiplies by attenuation x the true ratio, once, in fp32, as the engine's own op would.
class AttenuatingHooks : public model::UnitHooks {
 public:
  AttenuatingHooks(Strategy& inner, size_t unit, double attenuation, const std::vector<double>& true_scales)
      : inner_(inner), unit_(unit), attenuation_(attenuation), scales_(true_scales) {}
  void before_unit(size_t u) override {
    if (auto* hooks = inner_.forward_hooks()) hooks->before_unit(u);
  }
  at::Tensor after_unit(size_t u, const at::Tensor& output) override {
    at::Tensor out = output;
    if (u == unit_ && at::GradMode::is_enabled()) {
      double factor = attenuation_;
      if (u + 1 < scales_.size()) factor *= scales_[u] / scales_[u + 1];
      out = scale_gradient(out, factor);  // below the strategy's op: runs after it in backward
    }
    auto* hooks = inner_.forward_hooks();
    return hooks ? hooks->after_unit(u, out) : out;
  }
  // The unit scales the strategy runs the forward with: the true ones, with those of this unit and
  // the units below it multiplied by scales[u + 1] / scales[u], so that every other boundary's
  // ratio is unchanged and this one's is exactly 1.
  std::vector<double> forward_scales(std::vector<double> scales) const {
    if (unit_ + 1 >= scales.size()) return scales;
    const double c = scales[unit_ + 1] / scales[unit_];
    for (size_t k = 0; k < unit_; ++k) scales[k] *= c;
    scales[unit_] = scales[unit_ + 1];
    return scales;
  }

 private:
  Strategy& inner_;
  size_t unit_;
  double attenuation_;
  const std::vector<double>& scales_;
};

// `inner` with the faults injected where the trainer's calls reach it; every other call passes
// through. Counts the optimizer steps (taken or skipped; a resume sets the count) to know when.
class FaultInjectingStrategy : public Strategy {
 public:
  FaultInjectingStrategy(std::unique_ptr<Strategy> inner, const FaultInjection& faults, model::Llama& model,
                         int world_rank, int dp_rank)
      : inner_(std::move(inner)), faults_(faults), model_(model), world_rank_(world_rank), dp_rank_(dp_rank),
        hooks_(*inner_, static_cast<size_t>(std::max(faults.attenuate_unit, 0)), faults.attenuation, unit_scales_) {}

  std::string describe() const override { return inner_->describe(); }
  std::vector<pp::StageUnits> stage_units() const override { return inner_->stage_units(); }
  model::UnitHooks* forward_hooks() override {
    return attenuating() ? &hooks_ : inner_->forward_hooks();
  }
  void begin_micro_step(bool boundary) override { inner_->begin_micro_step(boundary); }
  // The true unit scales again before the gradients are unscaled with them.
  void finish_gradients(double loss_scale) override {
    if (attenuating() && !unit_scales_.empty()) inner_->set_unit_loss_scales(unit_scales_);
    inner_->finish_gradients(loss_scale);
  }
  double grad_norm() override { return inner_->grad_norm(); }
  void step(double grad_norm, double max_norm, double lr) override {
    inner_->step(grad_norm, max_norm, lr);
    ++steps_seen_;
  }
  std::vector<UnitGradStats> unit_grad_stats() override {
    if (dp_rank_ == faults_.overflow_rank && steps_seen_ == faults_.overflow_step) poison_unit_gradient(1);
    return inner_->unit_grad_stats();
  }
  void skip_step() override {
    inner_->skip_step();
    ++steps_seen_;
  }
  void set_unit_loss_scales(std::vector<double> scales) override {
    unit_scales_ = std::move(scales);
    inner_->set_unit_loss_scales(attenuating() ? hooks_.forward_scales(unit_scales_) : unit_scales_);
  }
  std::vector<std::string> unit_names() const override { return inner_->unit_names(); }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override { return inner_->full_parameters(); }
  ModelStateMemory memory() const override { return inner_->memory(); }
  optim::AdamW* replicated_optimizer() override { return inner_->replicated_optimizer(); }
  CheckpointView checkpoint_view() override {
    auto view = inner_->checkpoint_view();
    view.loaded = [this, loaded = std::move(view.loaded)](int64_t optimizer_steps, int64_t steps) {
      loaded(optimizer_steps, steps);
      steps_seen_ = steps;
    };
    return view;
  }
  std::vector<std::pair<std::string, comm::CommPtr>> extra_groups() const override { return inner_->extra_groups(); }
  // The gradients are read after finish_gradients (this step's 0-based index: the steps seen), the
  // parameters after step or skip_step (one more seen).
  std::vector<ReplicaSet> replicated_tensors(bool gradients) override {
    auto sets = inner_->replicated_tensors(gradients);
    const int64_t step = gradients ? steps_seen_ : steps_seen_ - 1;
    if (faults_.perturb_rank == world_rank_ && faults_.perturb_step == step && faults_.perturb_gradient == gradients)
      nudge(sets);
    return sets;
  }

 private:
  // An inf in the first element this rank's optimizer holds of unit u: the optimizer's segments
  // are views of the gradient shards the overflow check reads. A rank holding none of the unit
  // writes nothing.
  void poison_unit_gradient(size_t u) {
    std::set<std::string> names;
    for (size_t i : model_.units().at(u).params) names.insert(model_.parameters()[i].name);
    const auto view = inner_->checkpoint_view();
    for (const auto& seg : view.optimizer->segments())
      if (names.count(seg.name.substr(0, seg.name.find('@'))) && seg.grad.numel() > 0) {
        seg.grad.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<float>::infinity());
        return;
      }
  }
  // One ulp up on the first element of the tensor's piece (a ZeRO shard's "name[elements a..b)").
  // A rank holding no piece of it nudges nothing (failing here, on one rank, would leave the
  // others waiting).
  void nudge(std::vector<ReplicaSet>& sets) const {
    for (auto& set : sets)
      for (auto& [name, t] : set.tensors)
        if (name == faults_.perturb_tensor || name.rfind(faults_.perturb_tensor + "[", 0) == 0) {
          at::NoGradGuard no_grad;
          if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) return;  // fp32/fp64 runs only
          auto first = t.view({-1}).narrow(0, 0, 1);
          first.copy_(at::nextafter(first, at::full_like(first, INFINITY)));
          return;  // a tensor may sit in several sets: nudge it once
        }
  }

  bool attenuating() const { return faults_.attenuate_unit >= 0; }

  std::unique_ptr<Strategy> inner_;
  FaultInjection faults_;
  model::Llama& model_;
  int world_rank_, dp_rank_;
  int64_t steps_seen_ = 0;            // optimizer steps finished or skipped
  std::vector<double> unit_scales_;  // per-unit loss scaling's true scales, else empty
  AttenuatingHooks hooks_;
};

}  // namespace

void desync_from_environment(FaultInjection& faults) {
  const char* v = std::getenv("SHARDLM_TEST_DESYNC");
  if (!v || !*v) return;
  const char* usage = " (test only; expected rank=R,kind=skip|size[,phase=TEXT][,occurrence=N])";
  std::stringstream in(v);
  std::string item;
  FaultInjection f = faults;
  f.desync_occurrence = 1;
  while (std::getline(in, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) fail("SHARDLM_TEST_DESYNC: '", item, "' is not key=value", usage);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    try {
      if (key == "rank") f.desync_rank = std::stoi(value);
      else if (key == "kind") f.desync_kind = value;
      else if (key == "phase") f.desync_phase = value;
      else if (key == "occurrence") f.desync_occurrence = std::stoi(value);
      else fail("SHARDLM_TEST_DESYNC: unknown key '", key, "'", usage);
    } catch (const std::logic_error&) {  // std::stoi: not a number, or out of range
      fail("SHARDLM_TEST_DESYNC: ", key, "=", value, " is not a number", usage);
    }
  }
  if (f.desync_rank < 0 || (f.desync_kind != "skip" && f.desync_kind != "size") || f.desync_occurrence < 1)
    fail("SHARDLM_TEST_DESYNC='", v, "' needs rank >= 0, kind skip or size, occurrence >= 1", usage);
  if (!f.desync_phase.empty() && !comm::flight_recorder().enabled())  // phases are labelled only while it records
    fail("SHARDLM_TEST_DESYNC: phase=", f.desync_phase, " needs the flight recorder on (flight_recorder.enabled)");
  faults = f;
}

std::unique_ptr<Strategy> with_injected_faults(
    model::Llama& model, const ParallelDims& dims,
    const std::function<std::unique_ptr<Strategy>(const ParallelDims&)>& build) {
  FaultInjection faults = injected_faults();
  desync_from_environment(faults);
  if (!faults.any()) return build(dims);
  ParallelDims faulty = dims;  // the strategy keeps the communicators, not the dims
  // The data-parallel communicator is wrapped where the engines use it: as dp_comm, and as the
  // ZeRO engine's shard_comm when that is the same group (no hybrid sharding).
  auto wrap = [&](const std::function<comm::CommPtr(comm::CommPtr)>& decorate) {
    const bool shard_is_dp = faulty.shard_comm == faulty.dp_comm;
    faulty.dp_comm = decorate(faulty.dp_comm);
    if (shard_is_dp) faulty.shard_comm = faulty.dp_comm;
  };
  if (dims.dp_comm->rank() == faults.delay_gather_rank)
    wrap([&](comm::CommPtr c) { return std::make_shared<DelayingCommunicator>(c, faults.delay_gather_ms); });
  if (dims.dp_comm->rank() == faults.desync_rank)
    wrap([&](comm::CommPtr c) { return std::make_shared<DesyncingCommunicator>(c, faults); });
  return std::make_unique<FaultInjectingStrategy>(build(faulty), faults, model, dims.world->rank(),
                                                  dims.dp_comm->rank());
}

}  // namespace shardlm::parallel
