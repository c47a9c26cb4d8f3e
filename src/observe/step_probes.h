// Measurements taken inside a training step, the same way whatever the layout: the activations a
// micro-batch keeps for backward (checked against the planner, memory.json) and the wall time of the
// step's phases (time_<phase>_s in metrics.jsonl: where a step's time goes, e.g. what ZeRO's stages
// add to stage 0). They live here, not in the trainer, because they are observation, not training.
#pragma once
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "observe/metrics.h"

namespace shardlm::observe {

// CPU: held = heap bytes in use now, from a baseline taken at start() (what backward will read
// after a forward); peak growth = growth of the resident set's high-water mark since start(). GPU:
// the caching allocator's bytes in tensors, and its peak since start().
class ActivationProbe {
 public:
  // The callbacks through which a step's schedule probes (pipeline/schedule.h's StageCalls fields
  // of the same names); each empty where nothing is probed.
  struct StepCalls {
    std::function<int64_t()> held_bytes;
    std::function<void(int64_t micro_batch)> after_forward, after_backward;
  };

  explicit ActivationProbe(c10::Device device) : device_(device) {}
  void start();
  int64_t held_now() const;
  int64_t peak_growth() const;
  // For one step: `every_forward` starts the probe and reports the bytes held after each forward
  // (the trainer probes every step on the CPU, on a GPU in the first step only: start() resets the
  // allocator's peaks, which memory.json reports for the run); `first_step` (the process's first)
  // also stores micro-batch 0's held bytes after its forward in *held and the resident set's
  // growth over its forward and backward in *measured (memory.json's activations). The probe
  // must outlive the step.
  StepCalls step_calls(bool every_forward, bool first_step, int64_t* held, int64_t* measured);

 private:
  c10::Device device_;
  int64_t before_ = 0, heap_before_ = 0;
};

// Wall time per phase, summed over a step (micro-steps add up). CPU only: on a GPU the host just
// queues the work, and synchronizing to time it would change it.
class PhaseTimer {
 public:
  explicit PhaseTimer(c10::Device device) : enabled_(device.is_cpu()) {}
  void start() { t0_ = Clock::now(); }
  void stop(const std::string& phase);
  void add(const std::string& phase, double seconds);  // a phase timed elsewhere (the schedule's events)
  void record(StepMetrics& m) const;  // as time_<phase>_s

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  Clock::time_point t0_;
  std::map<std::string, double> seconds_;
};

}  // namespace shardlm::observe
