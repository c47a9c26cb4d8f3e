// The plan as text: the table `shardlm plan` prints (bytes per rank by category and ZeRO stage, the
// per-pipeline-stage table, communication per step, the recommendation and its reasons). Presentation
// only: every number comes from the Plan that make_plan computed.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "plan/adapters.h"
#include "plan/plan_internal.h"

namespace shardlm::plan {

namespace {
// The per-pipeline-stage table at one ZeRO stage: the requested one, else the recommended one when
// planned, else stage 0.
void format_pipeline_stages(std::ostringstream& out, const Plan& p) {
  const auto& r = p.request;
  size_t z = 0;
  const int want = r.zero_stage >= 0 ? r.zero_stage : p.recommended_stage;
  for (size_t i = 0; i < p.stages.size(); ++i)
    if (p.stages[i].stage == want) z = i;
  char line[512];
  const int L = static_cast<int>(r.model.num_hidden_layers);
  std::snprintf(line, sizeof line,
                "\nper pipeline stage (zero stage %d, %s schedule, %lld micro-batches; stage 0 runs the embedding, "
                "stage %d the final norm and head)\n",
                p.stages[z].stage, r.pipeline_schedule.c_str(),
                static_cast<long long>(r.accumulation), r.pp - 1);
  out << line;
  out << "per rank            ";
  for (const auto& ps : p.pipeline_stages) {
    std::snprintf(line, sizeof line, "%13s", ("pp stage " + std::to_string(ps.stage)).c_str());
    out << line;
  }
  out << "\n";
  auto text_row = [&](const char* name, auto get) {
    std::snprintf(line, sizeof line, "%-20s", name);
    out << line;
    for (const auto& ps : p.pipeline_stages) {
      std::snprintf(line, sizeof line, "%13s", get(ps).c_str());
      out << line;
    }
    out << "\n";
  };
  text_row("decoder layers", [&](const PipelineStagePlan& ps) {
    // Units [first, last]: layer i is unit 1 + i.
    const int first = std::max<int>(0, static_cast<int>(ps.first_unit) - 1);
    const int last = std::min<int>(L - 1, static_cast<int>(ps.last_unit) - 1);
    return std::to_string(first) + "-" + std::to_string(last) + " (" + std::to_string(ps.layers) + ")";
  });
  text_row("also", [&](const PipelineStagePlan& ps) {
    std::string s;
    if (ps.first_unit == 0) s = "embedding";
    if (ps.stage == r.pp - 1) s += std::string(s.empty() ? "" : "+") + (ps.embedding_copy ? "head+emb" : "head");
    return s.empty() ? std::string("-") : s;
  });
  text_row("parameters", [](const PipelineStagePlan& ps) {
    char b[32];
    std::snprintf(b, sizeof b, ps.parameters >= 1e9 ? "%.2fB" : "%.1fM",
                  ps.parameters >= 1e9 ? ps.parameters / 1e9 : ps.parameters / 1e6);
    return std::string(b);
  });
  text_row("micro-batches alive", [](const PipelineStagePlan& ps) { return std::to_string(ps.micro_batches_alive); });
  auto row = [&](const char* name, auto get) {
    text_row(name, [&](const PipelineStagePlan& ps) { return gb(static_cast<double>(get(ps.memory[z]))); });
  };
  row("compute params", [](const MemoryBreakdown& m) { return m.compute_params; });
  row("gradients", [](const MemoryBreakdown& m) { return m.gradients; });
  row("fp32 master params", [](const MemoryBreakdown& m) { return m.master_params; });
  row("optimizer states", [](const MemoryBreakdown& m) { return m.optimizer_states; });
  row("= model states", [](const MemoryBreakdown& m) { return m.model_states(); });
  row("activations", [](const MemoryBreakdown& m) { return m.activations; });
  if (r.recompute != "none") row("recomputed in backward", [](const MemoryBreakdown& m) { return m.recompute_peak; });
  row("comm buffers", [](const MemoryBreakdown& m) { return m.comm_buffers; });
  row("gathered working set", [](const MemoryBreakdown& m) { return m.gathered_peak; });
  row("backward temporaries", [](const MemoryBreakdown& m) { return m.backward_peak; });
  row("= total", [](const MemoryBreakdown& m) { return m.total(); });
  if (std::any_of(p.pipeline_stages.begin(), p.pipeline_stages.end(), [&](const PipelineStagePlan& ps) {
        return ps.memory[z].host > 0 || ps.memory[z].offloaded > 0;
      })) {
    row("+ host (offload)", [](const MemoryBreakdown& m) { return m.host; });
    row("+ on disk (NVMe)", [](const MemoryBreakdown& m) { return m.offloaded; });
  }
  if (r.device_memory > 0) {
    row("headroom", [&](const MemoryBreakdown& m) { return static_cast<int64_t>(r.device_memory) - m.total(); });
    text_row("fits", [&](const PipelineStagePlan& ps) {
      return std::string(ps.memory[z].total() <= static_cast<int64_t>(r.device_memory) ? "yes" : "NO");
    });
  }
  const auto& peak = p.stages[z];
  std::snprintf(line, sizeof line, "peak: pipeline stage %d, %s per rank%s\n", peak.peak_pipeline_stage,
                gb(static_cast<double>(peak.memory.total())).c_str(),
                r.device_memory > 0 ? (peak.fits ? " (fits device_memory)" : " (does NOT fit device_memory)") : "");
  out << line;
}
}  // namespace

std::string format_plan(const Plan& p) {
  const auto& r = p.request;
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "plan: %s, %.3gB parameters | %d device(s): dp=%d tp=%d%s pp=%d | %s | micro-batch %lld x seq %lld x accumulation %lld | recompute %s\n",
                r.model_name.c_str(), p.parameters / 1e9, r.devices, p.dp, r.tp, r.sequence_parallel ? " (sp)" : "",
                r.pp, r.precision.c_str(), static_cast<long long>(r.micro_batch), static_cast<long long>(r.seq_len),
                static_cast<long long>(r.accumulation), r.recompute.c_str());
  out << line;
  if (r.tp > 1 && r.params_override == 0) {
    std::snprintf(line, sizeof line, "tensor parallel: each rank holds %lld of the %lld parameters (Megatron layout%s)\n",
                  static_cast<long long>(p.rank_parameters), static_cast<long long>(p.parameters),
                  r.tp > r.model.num_key_value_heads ? "; KV heads replicated on tp/KV ranks" : "");
    out << line;
  }
  if (r.lora) out << lora_summary(p) << "\n";
  out << "activations: " << p.activation_method << "\n\n";
  if (!p.pipeline_stages.empty())
    out << "per rank of the largest pipeline stage (the pipeline stage in the last row; each stage below)\n";
  out << "per rank            ";
  for (const auto& s : p.stages) out << "      stage " << s.stage;
  out << "\n";
  auto row = [&](const char* name, auto get) {
    std::snprintf(line, sizeof line, "%-20s", name);
    out << line;
    for (const auto& s : p.stages) {
      std::snprintf(line, sizeof line, "%13s", gb(static_cast<double>(get(s))).c_str());
      out << line;
    }
    out << "\n";
  };
  row("compute params", [](const StagePlan& s) { return s.memory.compute_params; });
  row("gradients", [](const StagePlan& s) { return s.memory.gradients; });
  row("fp32 master params", [](const StagePlan& s) { return s.memory.master_params; });
  row("optimizer states", [](const StagePlan& s) { return s.memory.optimizer_states; });
  row("= model states", [](const StagePlan& s) { return s.memory.model_states(); });
  if (r.lora) row("frozen base (LoRA)", [](const StagePlan& s) { return s.memory.frozen_base; });
  row("activations", [](const StagePlan& s) { return s.memory.activations; });
  if (r.recompute != "none") row("recomputed in backward", [](const StagePlan& s) { return s.memory.recompute_peak; });
  row("comm buffers", [](const StagePlan& s) { return s.memory.comm_buffers; });
  row("gathered working set", [](const StagePlan& s) { return s.memory.gathered_peak; });
  row("backward temporaries", [](const StagePlan& s) { return s.memory.backward_peak; });
  row("= total", [](const StagePlan& s) { return s.memory.total(); });
  // Outside the device's total: optimizer offload's host memory (a GPU run's host optimizer) and the
  // bytes NVMe offload keeps in files.
  if (std::any_of(p.stages.begin(), p.stages.end(),
                  [](const StagePlan& s) { return s.memory.host > 0 || s.memory.offloaded > 0; })) {
    row("+ host (offload)", [](const StagePlan& s) { return s.memory.host; });
    row("+ on disk (NVMe)", [](const StagePlan& s) { return s.memory.offloaded; });
  }
  if (r.device_memory > 0) {
    row("headroom", [](const StagePlan& s) { return s.headroom; });
    out << "fits                ";
    for (const auto& s : p.stages) out << (s.fits ? "          yes" : "           NO");
    out << "\n";
  }
  if (!p.pipeline_stages.empty()) {
    out << "largest pp stage    ";
    for (const auto& s : p.stages) {
      std::snprintf(line, sizeof line, "%13d", s.peak_pipeline_stage);
      out << line;
    }
    out << "\n";
    format_pipeline_stages(out, p);
  }
  out << "\ncommunication per step per rank (x model size = algorithmic volume)\n";
  for (const auto& s : p.stages) {
    std::snprintf(line, sizeof line, "  stage %d: %.2fx", s.stage, s.comm_model_multiple);
    out << line;
    for (const auto& [op, bytes] : s.comm_bytes)
      if (op.rfind("tp_", 0) != 0) out << "  " << op << " " << gb(bytes);
    out << "\n";
  }
  // The tensor-parallel collectives are the same at every ZeRO stage.
  if (!p.stages.empty() && r.tp > 1 && r.params_override == 0) {
    out << "  tensor parallel:";
    for (const auto& [op, bytes] : p.stages.front().comm_bytes)
      if (op.rfind("tp_", 0) == 0) out << "  " << op << " " << gb(bytes);
    out << (r.sequence_parallel ? "\n    (per layer and micro-step 4 all-gathers of b*s*h/t and 4 reduce-scatters of b*s*h, "
                                  "the volume of 4 all-reduces of b*s*h; plus the embedding and head)\n"
                                : "\n    (per layer and micro-step 2 all-reduces of b*s*h in forward, 2 in backward; plus the "
                                  "embedding and head, and the vocab-parallel loss's 3 of b*s)\n");
  }
  if (r.pp > 1) {
    std::snprintf(line, sizeof line, "pipeline bubble %s = %.3f (%s)\n",
                  r.virtual_pipeline > 1 ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)", p.pipeline_bubble,
                  r.pipeline_schedule.c_str());
    out << line;
    if (r.pipeline_schedule == "zb_h1")  // its bubble depends on the B and W times, not on m and p alone
      out << "  (zb_h1 fills part of that with deferred weight-gradient work; with --machine, the bubble column "
             "simulates its own schedule from the measured B and W times)\n";
  }
  if (r.params_override == 0) {
    std::snprintf(line, sizeof line, "for comparison, Korthikanti et al. 2022 (GPT layer, 16-bit, no recomputation): %s of activations per rank\n",
                  gb(korthikanti_bytes(r.model, r.micro_batch, r.seq_len, r.tp, r.pp, r.sequence_parallel)).c_str());
    out << line;
  }
  if (!p.stages.empty() && p.stages[0].stage == 0 && p.dp > 1) {
    const double total = static_cast<double>(p.stages[0].memory.model_states()) * p.dp;
    std::snprintf(line, sizeof line, "data parallel keeps %s of model states in total, %s of it redundant\n",
                  gb(total).c_str(), gb(total - p.stages[0].memory.model_states()).c_str());
    out << line;
  }
  out << "\nrecommendation: zero stage " << p.recommended_stage << ", tp " << p.recommended_tp
      << (p.recommended_sequence_parallel ? " (sequence parallel)" : "") << ", pp " << p.recommended_pp
      << ", recompute " << p.recommended_recompute << "\n";
  for (const auto& why : p.reasons) out << "  - " << why << "\n";
  return out.str();
}

}  // namespace shardlm::plan
