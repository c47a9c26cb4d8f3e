// Where a run's step time went and what to try, from what the run directory holds (report.h's
// RunData): the measured phases of metrics.jsonl (time_forward_s, time_backward_s, time_grad_sync_s,
// time_optimizer_s, time_data_s, comm_<op>_wait_s), plan.json's `predicted` seconds when the run was
// given a machine profile (`machine_profile`, plan/time_model.h), and memory against device_memory.
// It walks seed 003's order: the device idle on data or communication first (the data loader's
// share; exposed communication over 30% of the step), then memory near the limit, then compute; and
// with a prediction, the phase furthest from it. Each finding names the number and the change to try.
// Medians over the steps after the first two (allocator and cache warm-up), evaluation excluded.
#pragma once
#include <string>
#include <vector>

#include "report/report.h"

namespace shardlm::observe {

struct PhaseComparison {
  std::string phase;  // forward, backward, optimizer, communication (exposed), data, step
  double measured_s = 0;
  double predicted_s = -1;  // -1: no prediction
};

struct Diagnosis {
  std::vector<PhaseComparison> phases;  // empty when metrics.jsonl has no step times
  std::vector<std::string> findings;    // in seed 003's order; the first is the one to act on
};

Diagnosis diagnose(const RunData& run);
// The report's section: the phase table (measured, predicted, ratio) and the findings.
std::string diagnosis_section(const RunData& run);

}  // namespace shardlm::observe
