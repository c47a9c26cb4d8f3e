// See schedule.h. Tags: Pipeline::tag.
#include "parallel/pipeline/schedule.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <tuple>

#include "comm/flight_recorder.h"
#include "model/weight_grad_deferral.h"
#include "parallel/pipeline/timeline.h"
#include "util/error.h"

namespace shardlm::parallel::pp {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "interleaved_1f1b") return Schedule::Interleaved1F1B;
  if (name == "zb_h1") return Schedule::ZeroBubbleH1;
  fail("parallelism.pipeline_schedule must be \"gpipe\", \"1f1b\", \"interleaved_1f1b\" or \"zb_h1\", got \"", name,
       "\"");
}

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::GPipe: return "gpipe";
    case Schedule::OneFOneB: return "1f1b";
    case Schedule::Interleaved1F1B: return "interleaved_1f1b";
    case Schedule::ZeroBubbleH1: return "zb_h1";
  }
  return "unknown";
}

void check_schedule(Schedule schedule, int stages, int chunks, int64_t micro, int64_t layers) {
  if (chunks < 1) fail("parallelism.virtual_pipeline_parallel must be >= 1, got ", chunks);
  if (schedule != Schedule::Interleaved1F1B) {
    if (chunks > 1)
      fail("parallelism.virtual_pipeline_parallel = ", chunks, " (model chunks per pipeline rank) needs "
           "parallelism.pipeline_schedule = \"interleaved_1f1b\" (it is \"", schedule_name(schedule),
           "\"); set the schedule or virtual_pipeline_parallel = 1");
    return;
  }
  // One stage runs the one-stage schedule whatever the name (F0 B0 F1 B1 ...): nothing to interleave.
  if (stages < 2 && chunks > 1)
    fail("parallelism.virtual_pipeline_parallel = ", chunks, " needs parallelism.pipeline_parallel >= 2 (it is ",
         stages, "); set virtual_pipeline_parallel to 1 without pipeline stages");
  if (stages < 2) return;
  if (chunks < 2)
    fail("parallelism.pipeline_schedule = \"interleaved_1f1b\" needs parallelism.virtual_pipeline_parallel >= 2 model "
         "chunks per rank (Megatron's virtual_pipeline_model_parallel_size), it is ", chunks,
         "; set it to 2 or more, or use \"1f1b\"");
  if (micro % stages != 0)
    fail("parallelism.pipeline_schedule = \"interleaved_1f1b\" needs the micro-batches per step "
         "(gradient_accumulation_steps = ", micro, ") to be a multiple of parallelism.pipeline_parallel = ", stages,
         " (as Megatron-LM requires); set gradient_accumulation_steps to ", (micro / stages + 1) * stages);
  if (layers % (static_cast<int64_t>(stages) * chunks) != 0)
    fail("parallelism.pipeline_schedule = \"interleaved_1f1b\": the model's ", layers, " decoder layers must split "
         "evenly over pipeline_parallel x virtual_pipeline_parallel = ", stages, " x ", chunks, " = ",
         static_cast<int64_t>(stages) * chunks, " model chunks; change virtual_pipeline_parallel or the stages");
}

const char* event_name(int kind) {
  static const char* const names[] = {"forward",          "backward",      "recv_activation", "recv_gradient",
                                      "send_activation",  "send_gradient", "backward_weight"};
  return kind >= 0 && kind < StageEvent::kKinds ? names[kind] : "unknown";
}

namespace {

// Megatron-LM's interleaved order (schedules.py, forward_backward_pipelining_with_interleaving, and
// PyTorch's ScheduleInterleaved1F1B): the k-th forward of a rank runs micro-batch
// (k / (p·v))·p + k % p on chunk (k % (p·v)) / p; the k-th backward the same micro-batch on the
// chunks in reverse.
std::vector<Action> interleaved_actions(int stage, int stages, int64_t micro, int chunks) {
  const int64_t p = stages, v = chunks, total = micro * v;
  auto nth = [&](int64_t k, bool backward) {
    const int64_t in_group = k % (p * v);
    const int chunk = static_cast<int>(in_group / p);
    return Action{backward ? Action::Backward : Action::Forward, (k / (p * v)) * p + in_group % p,
                  backward ? chunks - 1 - chunk : chunk};
  };
  const int64_t warmup = micro == p ? total : std::min<int64_t>(total, (p - stage - 1) * 2 + (v - 1) * p);
  std::vector<Action> actions;
  for (int64_t k = 0; k < warmup; ++k) actions.push_back(nth(k, false));
  for (int64_t k = 0; k < total - warmup; ++k) {
    actions.push_back(nth(k + warmup, false));
    actions.push_back(nth(k, true));
  }
  for (int64_t k = total - warmup; k < total; ++k) actions.push_back(nth(k, true));
  return actions;
}

// ZB-H1 (PyTorch's _get_1f1b_rank_ops with enable_zero_bubble, one stage per rank): 1F1B with each
// backward split into B and W; stage s emits the W of micro-batch j after the B of j + s, the last s
// at the end.
std::vector<Action> zero_bubble_h1_actions(int stage, int stages, int64_t micro) {
  std::vector<Action> actions;
  int64_t f = 0, b = 0, w = 0;
  const int64_t warmup = std::min<int64_t>(stages - stage - 1, micro);
  auto backward = [&] {
    actions.push_back({Action::BackwardInput, b++});
    if (b - 1 >= stage) actions.push_back({Action::BackwardWeight, w++});
  };
  while (f < warmup) actions.push_back({Action::Forward, f++});
  while (f < micro) {
    actions.push_back({Action::Forward, f++});
    backward();
  }
  while (b < micro) backward();
  while (w < micro) actions.push_back({Action::BackwardWeight, w++});
  return actions;
}

}  // namespace

std::vector<Action> schedule_actions(Schedule schedule, int stage, int stages, int64_t micro, int chunks) {
  if (schedule == Schedule::Interleaved1F1B && stages > 1 && chunks > 1)
    return interleaved_actions(stage, stages, micro, chunks);
  if (schedule == Schedule::ZeroBubbleH1 && stages > 1) return zero_bubble_h1_actions(stage, stages, micro);
  std::vector<Action> actions;
  int64_t f = 0, b = 0;
  // One stage has no bubble to trade against memory: GPipe's order there would only keep every
  // micro-batch alive for nothing (and the planner counts one), so it runs F0 B0 F1 B1 ... as 1F1B.
  if (schedule == Schedule::GPipe && stages > 1) {
    while (f < micro) actions.push_back({Action::Forward, f++});
  } else {
    const int64_t warmup = std::min<int64_t>(stages - stage - 1, micro);
    while (f < warmup) actions.push_back({Action::Forward, f++});
    while (f < micro) {
      actions.push_back({Action::Forward, f++});
      actions.push_back({Action::Backward, b++});
    }
  }
  while (b < micro) actions.push_back({Action::Backward, b++});
  return actions;
}

double schedule_bubble(Schedule schedule, int stages, int64_t micro, int chunks) {
  if (stages <= 1) return 0;
  const double p = stages, m = static_cast<double>(micro);
  const double v = schedule == Schedule::Interleaved1F1B ? chunks : 1;
  return (p - 1) / (v * m + p - 1);
}

SimulatedStep simulate_schedule(Schedule schedule, int stages, int64_t micro, int chunks,
                                const std::vector<ActionCost>& costs) {
  const int p = stages, V = p * chunks;
  if (static_cast<int>(costs.size()) != V) fail("simulate_schedule: ", costs.size(), " costs for ", V, " virtual stages");
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(schedule_actions(schedule, s, p, micro, chunks));
  // End times of each virtual stage's forward, input-gradient and weight-gradient part per micro-batch.
  const double never = -1;
  std::vector<double> forward_end(V * micro, never), input_end(V * micro, never);
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<int64_t> alive(p, 0);
  SimulatedStep out;
  out.busy.assign(p, 0);
  out.max_alive.assign(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < lists[s].size()) {
        const Action& a = lists[s][next[s]];
        const int k = a.chunk * p + s;
        const auto at = [&](int stage) { return static_cast<size_t>(stage) * micro + a.micro; };
        double ready = 0, cost = 0;
        if (a.kind == Action::Forward) {
          ready = k == 0 ? 0.0 : forward_end[at(k - 1)];
          cost = costs[k].forward;
        } else if (a.kind == Action::BackwardWeight) {
          ready = input_end[at(k)];
          cost = costs[k].backward_weight;
        } else {
          ready = k == V - 1 ? forward_end[at(k)] : input_end[at(k + 1)];
          cost = a.kind == Action::Backward ? costs[k].backward : costs[k].backward_input;
        }
        if (ready == never) break;
        const double end = std::max(ready, free_at[s]) + cost;
        free_at[s] = end;
        out.busy[s] += cost;
        if (a.kind == Action::Forward) {
          forward_end[at(k)] = end;
          out.max_alive[s] = std::max(out.max_alive[s], ++alive[s]);
        } else if (a.kind == Action::BackwardInput) {
          input_end[at(k)] = end;
        } else {
          if (a.kind == Action::Backward) input_end[at(k)] = end;
          --alive[s];
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    out.deadlock = out.deadlock || next[s] != lists[s].size();
    out.span = std::max(out.span, free_at[s]);
  }
  return out;
}

double StageTimes::seconds(int kind) const {
  double s = 0;
  for (const auto& e : events)
    if (e.kind == kind) s += e.end_s - e.start_s;
  return s;
}

namespace {
// A side message's send (Pipeline::set_side_messages): not on the timeline, which has one send per
// micro-batch, chunk and direction.
constexpr StageEvent kSideEvent{-1};
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

Pipeline::Pipeline(comm::CommPtr pp, Schedule schedule, std::vector<int64_t> hidden, at::TensorOptions options,
                   int chunks)
    : pp_(std::move(pp)), schedule_(schedule), chunks_(chunks), hidden_(std::move(hidden)), options_(options) {
  if (chunks_ < 1 || (chunks_ > 1 && (schedule_ != Schedule::Interleaved1F1B || stages() < 2)))
    fail("pipeline: ", chunks_, " model chunks per rank need the interleaved_1f1b schedule over >= 2 stages");
  if (stages() == 1) return;  // one stage sends and receives nothing
  forward_ = pp_->split(0, pp_->rank(), "pp_activations");
  backward_ = pp_->split(0, pp_->rank(), "pp_gradients");
}

std::vector<comm::CommPtr> Pipeline::groups() const {
  if (stages() == 1) return {};
  return {forward_, backward_};
}

at::Tensor Pipeline::sum_over_stages(const at::Tensor& loss_sum) const {
  auto t = loss_sum.to(at::kCPU).reshape({1});
  if (stages() > 1) pp_->all_reduce(t);  // zeros but on the last stage
  return t;
}

std::string Pipeline::describe(int64_t micro) const {
  if (stages() == 1) return "";
 const double p = stages(), m = static_cast<double>(micro);
  char line[400];
  const std::string chunks = chunks_ > 1 ? " x " + std::to_string(chunks_) + " model chunks per stage" : "";
  std::snprintf(line, sizeof line,
                "pipeline %d stages%s, schedule %s, %lld micro-batch(es) per step: bubble %s = %.0f%%%s", stages(),
                chunks.c_str(), schedule_name(schedule_), static_cast<long long>(micro),
                chunks_ > 1 ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)", 100 * schedule_bubble(schedule_, stages(), micro, chunks_),
                m < p ? " — fewer micro-batches than stages leaves most stages idle; raise "
                        "gradient_accumulation_steps (the micro-batches) to at least the stages"
                      : "");
  return line;
}

StageReport Pipeline::report(const StageTimes& t, int64_t micro, int64_t step, bool timeline) const {
  StageReport r;
  if (stages() == 1) return r;
  const int p = stages();
  // Per stage: bubble, activation peak, live micro-batches, and the seconds of its forwards, its
  // backwards (zb_h1: the Bs) and its weight backwards (zb_h1's Ws).
  constexpr int kPerStage = 6;
  const auto mine = at::tensor({t.bubble(), static_cast<double>(t.activation_peak), static_cast<double>(t.max_alive),
                                t.seconds(StageEvent::Forward), t.seconds(StageEvent::Backward),
                                t.seconds(StageEvent::BackwardWeight)},
                               at::kDouble);
  auto all = at::empty({kPerStage * p}, at::kDouble);
  pp_->all_gather(mine, all);
  double mean = 0;
  std::vector<double> bubbles;
  for (int st = 0; st < p; ++st) {
    const auto tag = ".stage" + std::to_string(st);
    const auto at_ = [&](int k) { return all[kPerStage * st + k].item<double>(); };
    r.metrics.emplace_back("pipeline_bubble" + tag, at_(0));
    r.metrics.emplace_back("pipeline_activation_peak" + tag, at_(1));
    r.metrics.emplace_back("pipeline_alive_micro_batches" + tag, at_(2));
    r.metrics.emplace_back("pipeline_forward_s" + tag, at_(3));
    r.metrics.emplace_back("pipeline_backward_s" + tag, at_(4));
    if (schedule_ == Schedule::ZeroBubbleH1) r.metrics.emplace_back("pipeline_weight_backward_s" + tag, at_(5));
    bubbles.push_back(at_(0));
    mean += at_(0) / p;
  }
  r.metrics.emplace_back("pipeline_bubble", mean);  // the stages' idle fraction, averaged
  r.metrics.emplace_back("pipeline_bubble_formula", schedule_bubble(schedule_, p, micro, chunks_));
  if (!timeline) return r;
  const int64_t rows = event_rows(micro, chunks_);
  auto events = at::empty({p * rows, kEventColumns}, at::kDouble);
  pp_->all_gather(pack_events(t, rows), events);
  if (first()) r.timeline = timeline_json(events, p, micro, step, bubbles, rows, schedule_name(schedule_), chunks_);
  return r;
}

at::Tensor Pipeline::receive(comm::Communicator& c, int64_t tag, int from, bool side) {
  auto t = side ? at::empty({side_numel_}, side_options_) : at::empty(hidden_, options_);
  c.recv(t, from, static_cast<int>(tag));
  return t;
}

void Pipeline::send(comm::Communicator& c, const at::Tensor& t, int64_t tag, int to, StageEvent event) {
  auto buffer = t.detach().contiguous();
  event.start_s = wall_now();
  sends_.push_back({buffer, c.send_async(buffer, to, static_cast<int>(tag)), event});
  retire_sends(false);  // test() also lets the earlier sends progress
}

void Pipeline::retire_sends(bool wait) {
  std::vector<PendingSend> pending;
  for (auto& s : sends_) {
    if (wait) s.work->wait();
    else if (!s.work->test()) {
      pending.push_back(std::move(s));
      continue;
    }
    s.event.end_s = wall_now();
    if (events_ && s.event.kind != kSideEvent.kind) events_->push_back(s.event);
  }
  sends_ = std::move(pending);
}

void Pipeline::drain_sends() { retire_sends(true); }

at::Tensor Pipeline::train(int64_t micro, const StageCalls& calls, StageTimes* times) {
  using Clock = std::chrono::steady_clock;
  if (schedule_ == Schedule::Interleaved1F1B && chunks_ > 1 && micro % stages() != 0)
    check_schedule(schedule_, stages(), chunks_, micro, 0);
  const auto t0 = Clock::now();
  StageTimes measured;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  struct Alive {
    at::Tensor in, out;  // out: the stage's output, or (last stage) the loss to back-propagate
    // zb_h1: the micro-batch's weight-gradient work, recorded by F, queued by B, run by W.
    std::shared_ptr<model::WeightGradQueue> deferred;
  };
  // zb_h1 splits each backward per linear layer (model/weight_grad_deferral.h).
  const bool split = schedule_ == Schedule::ZeroBubbleH1 && stages() > 1;
  std::vector<Alive> alive(micro * chunks_);  // micro-batch m on chunk c at m * chunks + c
  int64_t alive_now = 0;
  events_ = &measured.events;
  struct StopRecording {  // also when a receive times out and throws
    std::vector<StageEvent>*& events;
    ~StopRecording() { events = nullptr; }
  } stop_recording{events_};
  auto interval = [&measured](int kind, int64_t m, int c, double start) {
    measured.events.push_back({kind, m, start, wall_now(), c});
  };
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));
  if (calls.begin) calls.begin(micro);
  const auto actions = schedule_actions(schedule_, stage(), stages(), micro, chunks_);
  // The last action that makes parameter gradients: the strategy's boundary micro-step.
  size_t boundary = 0;
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind == Action::Backward || actions[i].kind == Action::BackwardWeight) boundary = i;

  const comm::FlightContext in_train("train");  // names what a rank was doing in its flight record
  auto forward = [&](int64_t m, int c) {
    const comm::FlightContext label(
        [&] { return "forward micro " + std::to_string(m) + (chunks_ > 1 ? " chunk " + std::to_string(c) : ""); });
    at::Tensor in, side;
    if (first_virtual(c)) {
      in = calls.input(m);
    } else {
      const double waiting = wall_now();
      in = receive(*forward_, tag(m, c, false), previous_rank()).requires_grad_(true);
      if (side_numel_ > 0) side = receive(*forward_, tag(m, c, false), previous_rank(), true);
      interval(StageEvent::RecvActivation, m, c, waiting);
    }
    if (side_numel_ > 0) calls.side_before_forward(m, c, side);
    const auto compute = Clock::now();
    const double computing = wall_now();
    auto deferred = split ? std::make_shared<model::WeightGradQueue>() : nullptr;
    at::Tensor out;
    {
      std::optional<model::WeightGradQueue::Recording> recording;
      if (deferred) recording.emplace(*deferred);
      out = calls.forward(m, c, in);
      if (last_virtual(c)) {
        auto [scaled, reported] = calls.loss(m, out);
        loss_sum.add_(reported.detach().to(at::kDouble));
        out = scaled;
      }
    }
    if (calls.synchronize && stages() > 1) calls.synchronize();  // times the bubble; one stage has none
    measured.busy_s += since(compute);
    interval(StageEvent::Forward, m, c, computing);
    if (!last_virtual(c)) {  // into the next rank's chunk c, or from the last rank to the first's chunk c + 1
      send(*forward_, out, tag(m, last() ? c + 1 : c, false), next_rank(), {StageEvent::SendActivation, m, 0, 0, c});
      if (side_numel_ > 0)
        send(*forward_, calls.side_after_forward(m, c), tag(m, last() ? c + 1 : c, false), next_rank(), kSideEvent);
    }
    alive[m * chunks_ + c] = {in, out, std::move(deferred)};
    measured.max_alive = std::max(measured.max_alive, ++alive_now);
    if (calls.held_bytes) measured.activation_peak = std::max(measured.activation_peak, calls.held_bytes());
    if (calls.after_forward && c == chunks_ - 1) calls.after_forward(m);  // m's forward on this stage is done
  };
  // kind: Backward (whole), BackwardInput (zb_h1's B) or BackwardWeight (its W); `boundary_step`:
  // the step's last action that makes parameter gradients.
  auto backward = [&](int64_t m, int c, Action::Kind kind, bool boundary_step) {
    const comm::FlightContext label([&] {
      return std::string(kind == Action::BackwardWeight ? "weight " : "") + "backward micro " + std::to_string(m) +
             (chunks_ > 1 ? " chunk " + std::to_string(c) : "");
    });
    Alive& a = alive[m * chunks_ + c];
    at::Tensor grad, side;  // the output's gradient (none on the last virtual stage: the loss)
    if (kind != Action::BackwardWeight && !last_virtual(c)) {
      const double waiting = wall_now();
      grad = receive(*backward_, tag(m, c, true), next_rank());
      if (side_numel_ > 0) side = receive(*backward_, tag(m, c, true), next_rank(), true);
      interval(StageEvent::RecvGradient, m, c, waiting);
    }
    // Side messages: a second root (gradient 1) beside the output, and what to send upstream.
    at::Tensor extra_root;
    if (side_numel_ > 0 && kind != Action::BackwardWeight) std::tie(extra_root, side) = calls.side_backward(m, c, side);
    if (extra_root.defined() && !extra_root.requires_grad()) extra_root = at::Tensor();
    const auto compute = Clock::now();
    const double computing = wall_now();
    at::Tensor input_grad;
    if (kind == Action::BackwardInput) {
      // B: the input's gradient and every linear's dX; the weight products and the other parameters'
      // gradients are queued (no .grad touched, no hook fired) and the graph is freed.
      // With a second root, one scalar: <out, grad> + root (out's gradient is still exactly grad).
      const auto root = extra_root.defined() ? (a.out * grad).sum() + extra_root : a.out;
      input_grad = a.deferred->backward_input(root, extra_root.defined() ? at::Tensor() : grad,
                                              first_virtual(c) ? at::Tensor() : a.in);
      a.in = a.out = at::Tensor();
    } else if (kind == Action::BackwardWeight) {
      // W: the queued products, every parameter's gradient accumulated once (hooks fire: buckets).
      calls.before_backward(m, boundary_step);
      a.deferred->backward_weight();
    } else {
      calls.before_backward(m, boundary_step);
      if (extra_root.defined()) torch::autograd::backward({a.out, extra_root}, {grad, at::ones_like(extra_root)});
      else if (grad.defined()) a.out.backward(grad);
      else a.out.backward();
      if (!first_virtual(c)) input_grad = a.in.grad();
    }
    if (calls.synchronize && stages() > 1) calls.synchronize();
    measured.busy_s += since(compute);
    interval(kind == Action::BackwardWeight ? StageEvent::BackwardWeight : StageEvent::Backward, m, c, computing);
    if (input_grad.defined()) {  // to the previous rank's chunk c, or from the first rank to the last's chunk c - 1
      send(*backward_, input_grad, tag(m, first() ? c - 1 : c, true), previous_rank(),
           {StageEvent::SendGradient, m, 0, 0, c});
      if (side_numel_ > 0)
        send(*backward_, side, tag(m, first() ? c - 1 : c, true), previous_rank(), kSideEvent);
    }
    if (kind == Action::BackwardInput) return;
    a = {};  // this micro-batch's activations are freed here
    --alive_now;
    if (calls.after_backward && c == 0) calls.after_backward(m);  // and so is its backward
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (a.kind == Action::Forward) forward(a.micro, a.chunk);
    else backward(a.micro, a.chunk, a.kind, i == boundary);
  }
  drain_sends();
  measured.span_s = since(t0);
  if (times) *times = std::move(measured);
  return sum_over_stages(loss_sum);
}

at::Tensor Pipeline::evaluate(int64_t micro, const StageCalls& calls) {
  at::NoGradGuard no_grad;
  const comm::FlightContext in_eval("evaluate");
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));
  if (calls.begin) calls.begin(micro);
  for (int64_t m = 0; m < micro; ++m)
    for (int c = 0; c < chunks_; ++c) {
      const at::Tensor in = first_virtual(c) ? calls.input(m) : receive(*forward_, tag(m, c, false), previous_rank());
      if (side_numel_ > 0)
        calls.side_before_forward(m, c, first_virtual(c) ? at::Tensor() : receive(*forward_, tag(m, c, false), previous_rank(), true));
      const at::Tensor out = calls.forward(m, c, in);
      if (last_virtual(c)) {
        loss_sum.add_(calls.loss(m, out).second.to(at::kDouble));
        continue;
      }
      send(*forward_, out, tag(m, last() ? c + 1 : c, false), next_rank(), {StageEvent::SendActivation, m, 0, 0, c});
      if (side_numel_ > 0)
        send(*forward_, calls.side_after_forward(m, c), tag(m, last() ? c + 1 : c, false), next_rank(), kSideEvent);
    }
  drain_sends();
  return sum_over_stages(loss_sum);
}

}  // namespace shardlm::parallel::pp
