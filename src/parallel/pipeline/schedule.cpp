// See schedule.h. Tags: micro-batch m's activations travel with tag 2m, their gradients with
// 2m + 1 (MPI keeps messages between two ranks in order, so tags may repeat across steps).
#include "parallel/pipeline/schedule.h"

#include <ATen/ATen.h>

#include <chrono>

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

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

Pipeline::Pipeline(comm::CommPtr pp, std::vector<int64_t> hidden, at::TensorOptions options)
    : pp_(std::move(pp)), hidden_(std::move(hidden)), options_(options) {
  forward_ = pp_->split(0, pp_->rank(), "pp_activations");
  backward_ = pp_->split(0, pp_->rank(), "pp_gradients");
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

at::Tensor Pipeline::train(Schedule schedule, int64_t micro, const StageCalls& calls, StageTimes* times) {
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

  auto forward = [&](int64_t m) {
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
    if (calls.synchronize) calls.synchronize();
    measured.busy_s += since(compute);
    interval(StageEvent::Forward, m, computing);
    if (!last()) send(*forward_, out, 2 * m, stage() + 1, {StageEvent::SendActivation, m});
    alive[m] = {in, out};
    measured.max_alive = std::max(measured.max_alive, ++alive_now);
    if (calls.held_bytes) measured.activation_peak = std::max(measured.activation_peak, calls.held_bytes());
  };
  auto backward = [&](int64_t m) {
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
    if (calls.synchronize) calls.synchronize();
    measured.busy_s += since(compute);
    interval(StageEvent::Backward, m, computing);
    if (!first()) send(*backward_, alive[m].in.grad(), 2 * m + 1, stage() - 1, {StageEvent::SendGradient, m});
    alive[m] = {};  // this micro-batch's activations are freed here
    --alive_now;
  };

  int64_t f = 0, b = 0;
  if (schedule == Schedule::GPipe) {
    while (f < micro) forward(f++);
  } else {
    const int64_t warmup = std::min<int64_t>(stages() - stage() - 1, micro);
    while (f < warmup) forward(f++);
    while (f < micro) {
      forward(f++);
      backward(b++);
    }
  }
  while (b < micro) backward(b++);
  drain_sends();
  measured.span_s = since(t0);
  if (times) *times = std::move(measured);
  return loss_sum;
}

at::Tensor Pipeline::evaluate(int64_t micro, const StageCalls& calls) {
  at::NoGradGuard no_grad;
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));
  for (int64_t m = 0; m < micro; ++m) {
    const at::Tensor in = first() ? calls.input(m) : receive(*forward_, 2 * m, stage() - 1);
    const at::Tensor out = calls.forward(m, in);
    if (last()) loss_sum.add_(calls.loss(m, out).second.to(at::kDouble));
    else send(*forward_, out, 2 * m, stage() + 1, {StageEvent::SendActivation, m});
  }
  drain_sends();
  return loss_sum;
}

}  // namespace shardlm::parallel::pp
