// search_layouts (search.h): plans every candidate layout with make_plan, keeps those that fit, and
// orders them by the time model's step time (or by bytes without a machine profile).
#include "plan/search.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "parallel/tensor/tp_layout.h"
#include "plan/plan_internal.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

std::vector<int> divisors(int64_t n, int64_t most) {
  std::vector<int> out;
  for (int64_t d = 1; d <= std::min(n, most); ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

bool tensor_parallel_allowed(const PlanRequest& r, int tp, bool sp) {
  if (r.lora && tp > 1) return false;  // LoRA runs without tensor, pipeline or context parallelism (adapters.h)
  try {
    parallel::tp::check_tensor_parallel(r.model, tp, sp, r.seq_len);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::string layout_name(const Candidate& c) {
  const auto& r = c.request;
  char b[160];
  std::snprintf(b, sizeof b, "dp=%d tp=%d%s pp=%d zero=%d mb=%lldx%lld recompute=%s", c.dp, r.tp,
                r.sequence_parallel ? "+sp" : "", r.pp, r.zero_stage, static_cast<long long>(r.micro_batch),
                static_cast<long long>(r.accumulation), r.recompute.c_str());
  std::string name = r.shard > 0 ? b + std::string(" shard=") + std::to_string(r.shard) : std::string(b);
  if (r.cp > 1) name += " cp=" + std::to_string(r.cp) + (r.cp_mode != "p2p" ? " " + r.cp_mode : "");
  if (r.pp > 1 && r.pipeline_schedule != "1f1b")
    name += " " + r.pipeline_schedule + (r.virtual_pipeline > 1 ? " v=" + std::to_string(r.virtual_pipeline) : "");
  if (offload_name(r) != "none") name += " offload=" + offload_name(r);
  return name;
}

// Offload variants (zero_optimization.offload_optimizer / offload_param device "nvme"). NVMe offload runs
// on CPU runs only (config_ranges.cpp), so a GPU profile gets none of them; a CPU machine has no
// "cpu" optimizer offload to gain (its device memory is the host's), so that is never listed there.
// ZeRO-Offload ("cpu" with the host buffers apart) only on a GPU profile: stages 1-3, no pipeline or
// expert parallelism (config_ranges.cpp); without a profile the device is unknown, so it is not listed.
struct Offload {
  bool states, params, host;
};
constexpr Offload kOffloads[] = {
    {false, false, false}, {true, false, false}, {false, true, false}, {true, true, false}, {false, false, true}};

bool offload_allowed(const Offload& o, const PlanRequest& r, int dp, int stage, const MachineProfile* machine) {
  // bf16 masters on a GPU only through the host optimizer (config_ranges.cpp).
  if (r.master_precision == "bf16" && machine && machine->device != "cpu" && !o.host) return false;
  if (o.host) return machine && machine->device != "cpu" && stage >= 1 && r.pp == 1 && r.ep == 1 && !(dp == 1 && stage > 1);
  if (!o.states && !o.params) return !(dp == 1 && stage > 0);  // sharding over one rank is stage 0
  if (machine && machine->device != "cpu") return false;
  if (o.params) return stage == 3 && r.pp == 1 && r.ep == 1;  // stage 3 only, as the trainer refuses otherwise
  return stage >= 1 && !(dp == 1 && stage > 1);  // at one rank, stages 1-3 shard nothing: stage 1 stands for them
}

}  // namespace

std::string offload_name(const PlanRequest& r) {
  if (r.offload_optimizer_host) return "states cpu";
  if (r.offload_optimizer_nvme && r.offload_param_nvme) return "states+params nvme";
  if (r.offload_optimizer_nvme) return "states nvme";
  if (r.offload_param_nvme) return "params nvme";
  return "none";
}

SearchResult search_layouts(const PlanRequest& request, const MachineProfile* machine) {
  if (request.params_override > 0) fail("--search needs a model (--model), not a bare parameter count");
  SearchResult out;
  const int D = request.devices;
  // The request's data-parallel ranks: those beside tp x pp, less context parallelism's (which share sequences).
  const int dp0 = D / (request.tp * request.pp) / std::max(1, request.cp);
  out.global_batch = request.micro_batch * request.accumulation * dp0;
  for (int tp : divisors(D, 8)) {
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      if (!tensor_parallel_allowed(request, tp, sp)) continue;
      for (int pp : divisors(D / tp, request.model.num_hidden_layers)) {
        const int dp = D / (tp * pp);
        if (request.lora && pp > 1) continue;
        // Context parallelism (plan/context.cpp): cp of the dp ranks share each sequence.
        for (int cp : context_parallel_candidates(request, dp, tp)) {
        if (out.global_batch % (dp / cp) != 0) continue;
        const int64_t per_rank = out.global_batch / (dp / cp);
        // Hybrid sharding: ZeRO over groups of `shard` data-parallel ranks (0: over all of them).
        std::vector<int> shards{0};
        for (int g : divisors(dp, dp - 1))
          if (g > 1) shards.push_back(g);
        for (int mb : divisors(per_rank, 64)) {
          if (cp > 1 && mb > 1) continue;  // split a sequence only once the micro-batch is one sequence
          for (const char* recompute : {"none", "selective", "full"}) {
            for (int shard : shards) {
            // Pipeline schedules (parallel/pipeline/schedule.h): 1F1B; interleaved with v = 2 where
            // the micro-batches and layers divide; ZB-H1.
            // GPipe is left out: 1F1B's bubble with fewer micro-batches alive.
            std::vector<std::pair<std::string, int>> schedules{{"1f1b", 1}};
            if (pp > 1 && (per_rank / mb) % pp == 0 && request.model.num_hidden_layers % (2 * pp) == 0)
              schedules.emplace_back("interleaved_1f1b", 2);
            if (pp > 1) schedules.emplace_back("zb_h1", 1);
            for (const auto& [schedule, vpp] : schedules) {
            bool params_stay = false;  // no unit's shard leaves memory (each under the persistence threshold)
            for (const auto& offload : kOffloads) {
            PlanRequest r = request;
            r.cp = cp;
            r.tp = tp;
            r.sequence_parallel = sp;
            r.pp = pp;
            r.micro_batch = mb;
            r.accumulation = per_rank / mb;
            r.recompute = recompute;
            r.pipeline_schedule = schedule;
            r.virtual_pipeline = vpp;
            r.pipeline_split.clear();
            r.shard = shard;
            r.zero_stage = -1;
            r.offload_optimizer_nvme = offload.states;
            r.offload_param_nvme = offload.params;
            r.offload_optimizer_host = offload.host;
            if (offload.params) r.offload_param_max_in_cpu = 0;  // every sharded unit's shard on disk
            bool any_stage = false;
            for (int stage = 0; stage <= 3; ++stage) any_stage = any_stage || offload_allowed(offload, r, dp, stage, machine);
            if (!any_stage) continue;
            if (offload.params && params_stay) continue;
            const Plan p = make_plan(r);
            for (const auto& s : p.stages) {
              if (!offload_allowed(offload, r, dp, s.stage, machine)) continue;
              if (offload.params && !offload.states && s.memory.offloaded == 0) {
                params_stay = true;
                continue;
              }
              if (shard > 0 && s.stage == 0) continue;  // nothing is sharded at stage 0
              ++out.considered;
              if (!s.fits) continue;
              Candidate c;
              c.request = r;
              c.request.zero_stage = s.stage;
              c.dp = dp / cp;  // the data-parallel ranks (cp of the dp ranks share each sequence)
              c.bytes = s.memory.total();
              c.disk = s.memory.offloaded;
              c.host = s.memory.host;
              if (machine) {
                try {
                  c.time = predict_step_time(p, s.stage, *machine);
                } catch (const Error& e) {
                  if (!c.disk && !c.host) throw;
                  --out.considered;
                  // A profile without the disk's (or host link's) rates: no such candidate, and the reason once.
                  const std::string note = std::string("offload candidates left out: ") + e.what();
                  if (std::find(out.notes.begin(), out.notes.end(), note) == out.notes.end()) out.notes.push_back(note);
                  continue;
                }
                c.timed = true;
              }
              out.fitting.push_back(c);
            }
            }
            }
            }
          }
        }
        }
      }
    }
  }
  // Fastest first; without a profile, layouts without offload first (offload is what costs time),
  // then the smallest.
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const Candidate& a, const Candidate& b) {
    if (a.timed && b.timed && a.time.step_s != b.time.step_s) return a.time.step_s < b.time.step_s;
    if (!a.timed && (a.disk > 0) != (b.disk > 0)) return a.disk == 0;  // (untimed: no host offload is listed)
    return a.bytes < b.bytes;
  });
  return out;
}

std::string format_search(const SearchResult& s, size_t show) {
  std::ostringstream out;
  char line[400];
  std::snprintf(line, sizeof line, "%zu of %d layouts fit (global batch %lld sequences)%s\n", s.fitting.size(),
                s.considered, static_cast<long long>(s.global_batch),
                !s.fitting.empty() && s.fitting[0].timed ? ", fastest predicted first:" : ", smallest first:");
  out << line;
  for (const auto& note : s.notes) out << "  " << note << "\n";
  const bool timed = !s.fitting.empty() && s.fitting[0].timed;
  std::snprintf(line, sizeof line, "%4s  %-84s %11s %9s %9s%s\n", "#", "layout", "device/rank", "host", "disk",
                timed ? "      step s    tokens/s     MFU   compute  comm(exp)  optimizer  offload(exp)" : "");
  out << line;
  for (size_t i = 0; i < s.fitting.size() && i < show; ++i) {
    const auto& c = s.fitting[i];
    std::snprintf(line, sizeof line, "%4zu  %-84s %11s %9s %9s", i + 1, layout_name(c).c_str(),
                  gb(static_cast<double>(c.bytes)).c_str(), gb(static_cast<double>(c.host)).c_str(),
                  gb(static_cast<double>(c.disk)).c_str());
    out << line;
    if (c.timed) {
      std::snprintf(line, sizeof line, "  %10.4f  %10.0f  %5.1f%%  %8.4f  %9.4f  %9.4f  %12.4f", c.time.step_s,
                    c.time.tokens_per_s, 100 * c.time.mfu, c.time.forward_s + c.time.backward_s, c.time.comm_exposed_s,
                    c.time.optimizer_s, c.time.offload_exposed_s);
      out << line;
    }
    out << "\n";
  }
  if (s.fitting.size() > show) out << "  ... " << s.fitting.size() - show << " more (--search-show N)\n";
  return out.str();
}

nlohmann::json search_to_json(const SearchResult& s) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : s.fitting) {
    const auto& r = c.request;
    nlohmann::json j = {{"dp", c.dp},
                        {"cp", r.cp},
                        {"cp_mode", r.cp_mode},
                        {"tp", r.tp},
                        {"sequence_parallel", r.sequence_parallel},
                        {"pp", r.pp},
                        {"zero_stage", r.zero_stage},
                        {"micro_batch", r.micro_batch},
                        {"accumulation", r.accumulation},
                        {"recompute", r.recompute},
                        {"shard", r.shard},
                        {"pipeline_schedule", r.pipeline_schedule},
                        {"virtual_pipeline_parallel", r.virtual_pipeline},
                        {"offload", offload_name(r)},
                        {"bytes_per_rank", c.bytes},
                        {"host_bytes_per_rank", c.host},
                        {"disk_bytes_per_rank", c.disk}};
    if (c.timed) j["predicted"] = to_json(c.time);
    list.push_back(j);
  }
  return {{"global_batch", s.global_batch}, {"considered", s.considered}, {"notes", s.notes}, {"fitting", list}};
}

}  // namespace shardlm::plan
