// `shardlm plan --search`: every layout of the job's devices that fits device_memory, with its bytes
// and, given a machine profile (machine_profile.h), its predicted step time (time_model.h), fastest
// first. The candidates: tensor parallelism up to 8 (where the heads, MLP width and vocabulary
// split; with and without sequence parallelism), pipeline stages dividing the rest (1F1B), ZeRO
// stages 0-3, micro-batches dividing each data-parallel rank's share of the global batch (which stays
// the request's: micro_batch x accumulation x dp), activation recomputation none / selective /
// full, at ZeRO stages 1-3 hybrid sharding over every proper divisor (> 1) of dp, context parallelism
// over every divisor cp of dp that splits the sequence into 2 cp chunks (the request's mode; with a
// micro-batch of one sequence: a longer micro-batch is the first thing to shrink), and NVMe offload:
// optimizer states (stages 1-3; at one rank stage 1), parameters at stage 3 (max_in_cpu 0: every
// sharded unit), and both, on a CPU machine (a GPU run's NVMe offload is not a candidate: the time model
// does not price its copies through the host yet); on a GPU profile ZeRO-Offload instead (optimizer
// "cpu": states in host memory, the host's AdamW), never on a CPU machine, whose optimizer already runs
// on the host: "cpu" offload gains nothing there. Offload is
// priced by the time model (disk I/O beside the compute it overlaps), so it ranks first only where
// nothing faster fits; a profile without a disk measurement leaves the offload candidates out with a
// note naming the field and the command. Without a profile: layouts without offload first, then by
// bytes per rank, smallest first.
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
  int dp = 1;  // data-parallel ranks: those beside tp x pp, divided by the request's cp
  int64_t bytes = 0;     // per rank: the plan's total (the busiest pipeline stage): device memory
  int64_t host = 0;      // host memory outside the device's (ZeRO-Offload's on a GPU; none on a CPU machine)
  int64_t disk = 0;      // offloaded to NVMe (the plan's `offloaded`)
  bool fits = true;
  bool timed = false;
  StepTimePrediction time;
};

struct SearchResult {
  int64_t global_batch = 0;  // sequences per optimizer step, every candidate's
  int considered = 0;        // layouts planned (fitting or not)
  std::vector<Candidate> fitting;  // ordered: fastest (or smallest) first
  std::vector<std::string> notes;  // what was left out, and why
};

// "none", "states nvme", "params nvme", "states+params nvme" or "states cpu": the request's offload.
std::string offload_name(const PlanRequest& r);

// `machine` may be null: order by bytes.
SearchResult search_layouts(const PlanRequest& request, const MachineProfile* machine);
std::string format_search(const SearchResult& s, size_t show);
nlohmann::json search_to_json(const SearchResult& s);

}  // namespace shardlm::plan
