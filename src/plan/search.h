// `shardlm plan --search`: every layout of the job's devices that fits device_memory, with its bytes
// and, given a machine profile (machine_profile.h), its predicted step time (time_model.h), fastest
// first. The candidates: tensor parallelism up to 8 (where the heads, MLP width and vocabulary
// split; with and without sequence parallelism), pipeline stages dividing the rest (1F1B), ZeRO
// stages 0-3, micro-batches dividing each data-parallel rank's share of the global batch (which stays
// the request's: micro_batch x accumulation x dp), activation recomputation none / selective /
// full, and at ZeRO stages 1-3 hybrid sharding over every proper divisor (> 1) of dp. Without a profile they are ordered by bytes per rank, smallest first.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "plan/machine_profile.h"
#include "plan/planner.h"
#include "plan/time_model.h"

namespace shardlm::plan {

struct Candidate {
  PlanRequest request;  // zero_stage set: the layout
  int dp = 1;
  int64_t bytes = 0;     // per rank: the plan's total (the busiest pipeline stage)
  bool fits = true;
  bool timed = false;
  StepTimePrediction time;
};

struct SearchResult {
  int64_t global_batch = 0;  // sequences per optimizer step, every candidate's
  int considered = 0;        // layouts planned (fitting or not)
  std::vector<Candidate> fitting;  // ordered: fastest (or smallest) first
};

// `machine` may be null: order by bytes.
SearchResult search_layouts(const PlanRequest& request, const MachineProfile* machine);
std::string format_search(const SearchResult& s, size_t show);
nlohmann::json search_to_json(const SearchResult& s);

}  // namespace shardlm::plan
