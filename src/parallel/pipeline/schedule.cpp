// See schedule.h. Tags: micro-batch m's activations travel with tag 2m, their gradients with
// 2m + 1 (MPI keeps messages between two ranks in order, so tags may repeat across steps).
#include "parallel/pipeline/schedule.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>

#include "comm/flight_recorder.h"
#include "parallel/pipeline/timeline.h"
#include "util/error.h"

namespace shardlm::parallel::pp {

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  fail("parallelism.pipeline_schedule must be \"gpipe\" or \"1f1b\", got \"", name, "\"");
}

const char* event_name(int kind) {
  static const char* const names[] = {"forward", "backward", "recv_activation", "recv_gradient", "send_activation",
                                      "send_gradient"};
  return kind >= 0 && kind < 6 ? names[kind] : "unknown";
}

std::vector<Action> schedule_actions(Schedule schedule, int stage, int stages, int64_t micro) {
  std::vector<Action> actions;
  int64_t f = 0, b = 0;
  // One stage has no bubble to trade against memory: GPipe's order there would only keep every
  // micro-batch's activations alive (and the planner counts one), so it runs F0 B0 F1 B1 ... as 1F1B.
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

double StageTimes::seconds(int kind) const {
  double s = 0;
  for (const auto& e : events)
    if (e.kind == kind) s += e.end_s - e.start_s;
  return s;
}

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

Pipeline::Pipeline(comm::CommPtr pp, Schedule schedule, std::vector<int64_t> hidden, at::TensorOptions options)
    : pp_(std::move(pp)), schedule_(schedule), hidden_(std::move(hidden)), options_(options) {
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
  char line[320];
  std::snprintf(line, sizeof line,
                "pipeline %d stages, schedule %s, %lld micro-batch(es) per step: bubble (p-1)/(m+p-1) = %.0f%%%s",
                stages(), schedule_ == Schedule::GPipe ? "gpipe" : "1f1b", static_cast<long long>(micro),
                100 * (p - 1) / (m + p - 1),
                m < p ? " — fewer micro-batches than stages leaves most stages idle; raise "
                        "gradient_accumulation_steps (the micro-batches) to at least the stages"
                      : "");
  return line;
}

StageReport Pipeline::report(const StageTimes& t, int64_t micro, int64_t step, bool timeline) const {
  StageReport r;
  if (stages() == 1) return r;
  const int p = stages();
  const auto mine = at::tensor({t.bubble(), static_cast<double>(t.activation_peak), static_cast<double>(t.max_alive)},
                               at::kDouble);
  auto all = at::empty({3 * p}, at::kDouble);
  pp_->all_gather(mine, all);
  double mean = 0;
  std::vector<double> bubbles;
  for (int st = 0; st < p; ++st) {
    const auto tag = ".stage" + std::to_string(st);
    r.metrics.emplace_back("pipeline_bubble" + tag, all[3 * st].item<double>());
    r.metrics.emplace_back("pipeline_activation_peak" + tag, all[3 * st + 1].item<double>());
    r.metrics.emplace_back("pipeline_alive_micro_batches" + tag, all[3 * st + 2].item<double>());
    bubbles.push_back(all[3 * st].item<double>());
    mean += all[3 * st].item<double>() / p;
  }
  r.metrics.emplace_back("pipeline_bubble", mean);  // the stages' idle fraction, averaged
  r.metrics.emplace_back("pipeline_bubble_formula", (p - 1.0) / (static_cast<double>(micro) + p - 1.0));
  if (!timeline) return r;
  auto events = at::empty({p * 6 * micro, 4}, at::kDouble);
  pp_->all_gather(pack_events(t, micro), events);
  if (first()) r.timeline = timeline_json(events, p, micro, step, bubbles);
  return r;
}

at::Tensor Pipeline::receive(comm::Communicator& c, int64_t tag, int from) {
  auto t = at::empty(hidden_, options_);
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
    if (events_) events_->push_back(s.event);
  }
  sends_ = std::move(pending);
}

void Pipeline::drain_sends() { retire_sends(true); }

at::Tensor Pipeline::train(int64_t micro, const StageCalls& calls, StageTimes* times) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  StageTimes measured;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  struct Alive {
    at::Tensor in, out;  // out: the stage's output, or (last stage) the loss to back-propagate
  };
  std::vector<Alive> alive(micro);
  int64_t alive_now = 0;
  events_ = &measured.events;
  struct StopRecording {  // also when a receive times out and throws
    std::vector<StageEvent>*& events;
    ~StopRecording() { events = nullptr; }
  } stop_recording{events_};
  auto interval = [&measured](int kind, int64_t m, double start) {
    measured.events.push_back({kind, m, start, wall_now()});
  };
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));
  if (calls.begin) calls.begin(micro);

  const comm::FlightContext in_train("train");  // names what a rank was doing in its flight record
  auto forward = [&](int64_t m) {
    const comm::FlightContext label("forward micro " + std::to_string(m));
    at::Tensor in;
    if (first()) {
      in = calls.input(m);
    } else {
      const double waiting = wall_now();
      in = receive(*forward_, 2 * m, stage() - 1).requires_grad_(true);
      interval(StageEvent::RecvActivation, m, waiting);
    }
    const auto compute = Clock::now();
    const double computing = wall_now();
    at::Tensor out = calls.forward(m, in);
    if (last()) {
      auto [scaled, reported] = calls.loss(m, out);
      loss_sum.add_(reported.detach().to(at::kDouble));
      out = scaled;
    }
    if (calls.synchronize && stages() > 1) calls.synchronize();  // times the bubble; one stage has none
    measured.busy_s += since(compute);
    interval(StageEvent::Forward, m, computing);
    if (!last()) send(*forward_, out, 2 * m, stage() + 1, {StageEvent::SendActivation, m});
    alive[m] = {in, out};
    measured.max_alive = std::max(measured.max_alive, ++alive_now);
    if (calls.held_bytes) measured.activation_peak = std::max(measured.activation_peak, calls.held_bytes());
    if (calls.after_forward) calls.after_forward(m);
  };
  auto backward = [&](int64_t m) {
    const comm::FlightContext label("backward micro " + std::to_string(m));
    at::Tensor grad;
    if (!last()) {
      const double waiting = wall_now();
      grad = receive(*backward_, 2 * m + 1, stage() + 1);
      interval(StageEvent::RecvGradient, m, waiting);
    }
    const auto compute = Clock::now();
    const double computing = wall_now();
    calls.before_backward(m, m == micro - 1);
    if (last()) alive[m].out.backward();
    else alive[m].out.backward(grad);
    if (calls.synchronize && stages() > 1) calls.synchronize();
    measured.busy_s += since(compute);
    interval(StageEvent::Backward, m, computing);
    if (!first()) send(*backward_, alive[m].in.grad(), 2 * m + 1, stage() - 1, {StageEvent::SendGradient, m});
    alive[m] = {};  // this micro-batch's activations are freed here
    --alive_now;
    if (calls.after_backward) calls.after_backward(m);
  };

  for (const Action& a : schedule_actions(schedule_, stage(), stages(), micro)) {
    if (a.kind == Action::Forward) forward(a.micro);
    else backward(a.micro);
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
  for (int64_t m = 0; m < micro; ++m) {
    const at::Tensor in = first() ? calls.input(m) : receive(*forward_, 2 * m, stage() - 1);
    const at::Tensor out = calls.forward(m, in);
    if (last()) loss_sum.add_(calls.loss(m, out).second.to(at::kDouble));
    else send(*forward_, out, 2 * m, stage() + 1, {StageEvent::SendActivation, m});
  }
  drain_sends();
  return sum_over_stages(loss_sum);
}

}  // namespace shardlm::parallel::pp
