// See step_probes.h.
#include "observe/step_probes.h"

#include <ATen/ATen.h>

#include "util/device.h"
#include "util/process_memory.h"

namespace shardlm::observe {

void ActivationProbe::start() {
  if (device_.is_cuda()) {
    synchronize(device_);
    reset_device_peaks(device_);
    before_ = device_memory(device_).allocated;
    return;
  }
  // One-time allocations (BLAS thread buffers, autograd engine state) are not activations:
  // trigger them before the measurement starts.
  auto w = at::ones({64, 64}).set_requires_grad(true);
  at::mm(w, w).sum().backward();
  reset_peak_resident();
  before_ = resident_bytes();
  heap_before_ = heap_in_use_bytes();
}

int64_t ActivationProbe::held_now() const {
  return device_.is_cuda() ? device_memory(device_).allocated - before_ : heap_in_use_bytes() - heap_before_;
}

int64_t ActivationProbe::peak_growth() const {
  return device_.is_cuda() ? device_memory(device_).peak_allocated - before_ : peak_resident_bytes() - before_;
}

ActivationProbe::StepCalls ActivationProbe::step_calls(bool every_forward, bool first_step, int64_t* held,
                                                       int64_t* measured) {
  StepCalls calls;
  // Once, before the first step's measurement: start-up's freed heap goes back to the system, so the
  // first step's resident growth is its own demand, not what is left after reusing those holes
  // (QLoRA's measured peak varied 143-161 MB over runs with them kept).
  if (first_step && !device_.is_cuda()) release_free_heap();
  if (every_forward || first_step) {
    start();
    calls.held_bytes = [this] { return held_now(); };
  }
  if (first_step) {
    calls.after_forward = [this, held](int64_t m) {
      if (m == 0) *held = held_now();
    };
    calls.after_backward = [this, measured](int64_t m) {
      if (m == 0) *measured = peak_growth();
    };
  }
  return calls;
}

void PhaseTimer::stop(const std::string& phase) {
  if (enabled_) seconds_[phase] += std::chrono::duration<double>(Clock::now() - t0_).count();
}

void PhaseTimer::add(const std::string& phase, double seconds) {
  if (enabled_) seconds_[phase] += seconds;
}

void PhaseTimer::record(StepMetrics& m) const {
  for (const auto& [phase, s] : seconds_) m.extra["time_" + phase + "_s"] = s;
}

}  // namespace shardlm::observe
