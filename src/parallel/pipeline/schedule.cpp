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

void Pipeline::send(comm::Communicator& c, const at::Tensor& t, int64_t tag, int to) {
  auto buffer = t.detach().contiguous();
  sends_.emplace_back(buffer, c.send_async(buffer, to, static_cast<int>(tag)));
  // Forget the sends already delivered (test() also lets them progress).
  std::vector<std::pair<at::Tensor, comm::WorkPtr>> pending;
  for (auto& s : sends_)
    if (!s.second->test()) pending.push_back(std::move(s));
  sends_ = std::move(pending);
}

void Pipeline::drain_sends() {
  for (auto& s : sends_) s.second->wait();
  sends_.clear();
}

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
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));

  auto forward = [&](int64_t m) {
    at::Tensor in = first() ? calls.input(m) : receive(*forward_, 2 * m, stage() - 1).requires_grad_(true);
    const auto compute = Clock::now();
    at::Tensor out = calls.forward(m, in);
    if (last()) {
      auto [scaled, reported] = calls.loss(m, out);
      loss_sum.add_(reported.detach().to(at::kDouble));
      out = scaled;
    }
    if (calls.synchronize) calls.synchronize();
    measured.busy_s += since(compute);
    if (!last()) send(*forward_, out, 2 * m, stage() + 1);
    alive[m] = {in, out};
    measured.max_alive = std::max(measured.max_alive, ++alive_now);
    if (calls.held_bytes) measured.activation_peak = std::max(measured.activation_peak, calls.held_bytes());
  };
  auto backward = [&](int64_t m) {
    const at::Tensor grad = last() ? at::Tensor() : receive(*backward_, 2 * m + 1, stage() + 1);
    const auto compute = Clock::now();
    calls.before_backward(m, m == micro - 1);
    if (last()) alive[m].out.backward();
    else alive[m].out.backward(grad);
    if (calls.synchronize) calls.synchronize();
    measured.busy_s += since(compute);
    if (!first()) send(*backward_, alive[m].in.grad(), 2 * m + 1, stage() - 1);
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
  if (times) *times = measured;
  return loss_sum;
}

at::Tensor Pipeline::evaluate(int64_t micro, const StageCalls& calls) {
  at::NoGradGuard no_grad;
  auto loss_sum = at::zeros({}, options_.dtype(at::kDouble));
  for (int64_t m = 0; m < micro; ++m) {
    const at::Tensor in = first() ? calls.input(m) : receive(*forward_, 2 * m, stage() - 1);
    const at::Tensor out = calls.forward(m, in);
    if (last()) loss_sum.add_(calls.loss(m, out).second.to(at::kDouble));
    else send(*forward_, out, 2 * m, stage() + 1);
  }
  drain_sends();
  return loss_sum;
}

}  // namespace shardlm::parallel::pp
