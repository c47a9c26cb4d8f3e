#include "plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/llama.h"
#include "parallel/zero/flat_layout.h"
#include "util/error.h"

namespace shardlm::plan {
namespace {

int64_t compute_bytes(const std::string& precision) { return precision == "fp32" ? 4 : 2; }

std::string gb(double bytes) {
  char buf[32];
  const bool big = std::abs(bytes) >= 1e9;
  std::snprintf(buf, sizeof buf, big ? "%.1f GB" : "%.1f MB", big ? bytes / 1e9 : bytes / 1e6);
  return buf;
}

// Korthikanti et al. 2022, GPT layer with 16-bit activations and no recomputation:
// s*b*h*(34 + 5*a*s/h) bytes per layer (divided by tp with sequence parallelism).
double korthikanti_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t s, int tp, int pp) {
  const double h = cfg.hidden_size, a = cfg.num_attention_heads;
  const double layers = std::ceil(double(cfg.num_hidden_layers) / pp);
  return layers * s * b * h * (34 + 5 * a * s / h) / tp;
}

// Model states per rank when the model is given only as a parameter count: the ZeRO paper's
// arithmetic without padding (mixed precision: 2 + 2 + 12 bytes per parameter).
MemoryBreakdown bare_model_states(int64_t psi, int stage, int dp, const std::string& precision) {
  const int64_t c = compute_bytes(precision), master = c < 4 ? 4 : 0;
  MemoryBreakdown m;
  m.compute_params = stage == 3 ? c * psi / dp : c * psi;
  m.gradients = stage >= 2 ? c * psi / dp : c * psi;
  m.master_params = stage >= 1 ? master * psi / dp : master * psi;
  m.optimizer_states = stage >= 1 ? 8 * psi / dp : 8 * psi;
  return m;
}

}  // namespace

double parse_bytes(const std::string& text) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("cannot read a size from '", text, "'; write e.g. 32GB, 80GiB or 500MB");
  }
  std::string unit = text.substr(end);
  std::transform(unit.begin(), unit.end(), unit.begin(), ::toupper);
  const std::map<std::string, double> units = {{"", 1},        {"B", 1},          {"KB", 1e3},        {"MB", 1e6},
                                               {"GB", 1e9},    {"TB", 1e12},      {"KIB", 1024.0},    {"MIB", 1048576.0},
                                               {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto it = units.find(unit);
  if (it == units.end() || value < 0) fail("cannot read a size from '", text, "'; write e.g. 32GB, 80GiB or 500MB");
  return value * it->second;
}

MemoryBreakdown model_state_bytes(const model::LlamaConfig& cfg, int stage, int dp, const std::string& precision,
                                  const std::string& grad_accum_dtype, double persistence_threshold) {
  const auto shape = model::describe(cfg);
  const auto layout = parallel::FlatLayout::build(shape, dp);
  const int64_t c = compute_bytes(precision), g = grad_accum_dtype == "bf16" ? 2 : 4;
  MemoryBreakdown m;
  if (stage == 0) {  // data parallel: fp32 in the trainer; mixed precision as DeepSpeed stage 0
    const int64_t psi = layout.numel();
    m.compute_params = c * psi;
    m.gradients = c * psi;
    m.master_params = c < 4 ? 4 * psi : 0;
    m.optimizer_states = 8 * psi;
    return m;
  }
  for (const auto& u : layout.units) {
    const bool persistent = stage < 3 || u.padded_numel < persistence_threshold;
    m.compute_params += ((persistent ? u.padded_numel : 0) + (stage == 3 ? u.shard_numel : 0)) * c;
    m.gradients += stage == 1 ? u.padded_numel * c : u.shard_numel * g;
    if (c < 4) m.master_params += u.shard_numel * 4;
    m.optimizer_states += 8 * u.shard_numel;
  }
  return m;
}

ActivationEstimate estimate_activations(const model::LlamaConfig& cfg, int64_t b, int64_t T,
                                        const std::string& precision, const std::string& recompute, int tp, int pp,
                                        bool fused_attention) {
  // What this implementation keeps for backward (the ops of model/llama.cpp), per token:
  //  - each RMSNorm: its input upcast to fp32, the normalised value and the weighted output
  //    (3 x hidden in fp32 models; 4 + 2 + 2 bytes per element in 16-bit ones);
  //  - attention: rotated q, k and v repeated to all heads, the attention output (4 x hidden),
  //    and, on the eager path, the probabilities, heads x T per token, in fp32 (plus their 16-bit
  //    copy); a fused kernel keeps only the softmax's log-sum-exp, one fp32 value per head;
  //  - MLP: gate, SiLU, up and their product (4 x intermediate);
  //  - head: the final norm and the fp32 log-probabilities (vocab).
  // 16-bit products computed in fp32 on CPU (model/fp32_products.h) keep only their 16-bit inputs.
  // Recomputation (model/recompute.h): "selective" keeps the attention core's inputs q, k, v (k and
  // v not yet repeated to all heads) instead of its internals, and rebuilds one layer's core at a
  // time in backward; "full" keeps each layer's input and rebuilds one whole layer at a time.
  const int64_t c = compute_bytes(precision), h = cfg.hidden_size, f = cfg.intermediate_size,
                a = cfg.num_attention_heads, V = cfg.vocab_size, kv = cfg.num_key_value_heads * cfg.head_dim();
  const int64_t tokens = b * T;
  const int64_t norm = h * (c < 4 ? 4 + 2 * c : 3 * c);
  const int64_t attention = fused_attention ? a * 4 : a * T * (4 + (c < 4 ? c : 0));
  const int64_t per_token = 2 * norm + 4 * h * c + 4 * f * c + attention;
  const int64_t layer_full = tokens * per_token / tp;
  const int64_t layers = (cfg.num_hidden_layers + pp - 1) / pp;
  const int64_t head = tokens * (norm + 4 * V / tp);
  if (recompute == "full") return {layers * tokens * h * c / tp + head, layer_full};
  if (recompute == "selective") {
    const int64_t kept = 2 * norm + (2 * h + 2 * kv) * c + 4 * f * c;
    return {layers * tokens * kept / tp + head, tokens * (attention + 2 * h * c) / tp};
  }
  return {layers * layer_full + head, 0};
}

int64_t activation_bytes(const model::LlamaConfig& cfg, int64_t b, int64_t T, const std::string& precision,
                         const std::string& recompute, int tp, int pp, bool fused_attention) {
  const auto e = estimate_activations(cfg, b, T, precision, recompute, tp, pp, fused_attention);
  return e.held + e.recompute_peak;
}

Plan make_plan(const PlanRequest& r) {
  if (r.devices < 1) fail("--devices must be >= 1");
  if (r.tp < 1 || r.pp < 1 || r.devices % (r.tp * r.pp) != 0)
    fail("devices ", r.devices, " must be a multiple of tp x pp = ", r.tp * r.pp);
  if (r.precision != "bf16" && r.precision != "fp16" && r.precision != "fp32")
    fail("--precision must be bf16, fp16 or fp32, got '", r.precision, "'");
  if (r.recompute != "none" && r.recompute != "full" && r.recompute != "selective")
    fail("--recompute must be none, full or selective, got '", r.recompute, "'");
  if (r.params_override == 0 && r.seq_len > r.model.max_position_embeddings)
    fail("--seq-len ", r.seq_len, " exceeds the model's max_position_embeddings ", r.model.max_position_embeddings);
  Plan p;
  p.request = r;
  p.dp = r.devices / (r.tp * r.pp);
  const bool bare = r.params_override > 0;
  p.parameters = bare ? r.params_override : r.model.num_parameters();
  const int64_t c = compute_bytes(r.precision);
  const double model_bytes = static_cast<double>(p.parameters) * c;
  p.pipeline_bubble = r.pp > 1 ? double(r.pp - 1) / double(r.accumulation + r.pp - 1) : 0;
  p.activation_method =
      bare ? "not estimated (parameter count only)"
           : std::string("tensors this implementation saves for backward, per layer ~(10h + 4f) x tokens in the "
                         "compute dtype" +
                             std::string(r.fused_attention ? " (fused attention: no T^2 term)"
                                                           : " + heads x T^2 attention probabilities in fp32 (eager attention)")) +
                 (r.recompute == "full" ? "; full recomputation keeps each layer's input and rebuilds one layer" : "") +
                 (r.recompute == "selective" ? "; selective recomputation keeps q, k, v and rebuilds the attention core" : "") +
                 " (Korthikanti et al. 2022's GPT formula sbh(34 + 5as/h) shown alongside)";
  const int slice = r.tp * r.pp;  // tp/pp split the model evenly (an approximation for planning)
  for (int stage = 0; stage <= 3; ++stage) {
    if (r.zero_stage >= 0 && stage != r.zero_stage) continue;
    StagePlan sp;
    sp.stage = stage;
    sp.memory = bare ? bare_model_states(p.parameters, stage, p.dp, r.precision)
                     : model_state_bytes(r.model, stage, p.dp, r.precision, r.grad_accum_dtype, r.persistence_threshold);
    if (slice > 1) {
      for (int64_t* v : {&sp.memory.compute_params, &sp.memory.gradients, &sp.memory.master_params,
                         &sp.memory.optimizer_states})
        *v /= slice;
    }
    if (!bare) {
      const auto act = estimate_activations(r.model, r.micro_batch, r.seq_len, r.precision, r.recompute, r.tp, r.pp,
                                            r.fused_attention);
      sp.memory.activations = act.held;
      sp.memory.recompute_peak = act.recompute_peak;
      const auto layout = parallel::FlatLayout::build(model::describe(r.model), p.dp);
      const int64_t largest = layout.largest_unit_numel() / slice;
      sp.memory.comm_buffers = stage == 0 ? 0 : stage == 1 ? layout.shard_numel() / slice * c : 2 * largest * c;
      if (stage == 3) sp.memory.gathered_peak = (largest + std::min<int64_t>(largest, r.prefetch)) * c;
    }
    // Communication per step per rank (message bytes as the trainer counts them: each rank's input).
    const double psi_bytes = model_bytes / slice;
    if (p.dp > 1) {
      if (stage == 0) sp.comm_bytes["all_reduce"] = psi_bytes;
      if (stage >= 1) sp.comm_bytes["reduce_scatter"] = psi_bytes * (stage >= 2 ? r.accumulation : 1);
      if (stage <= 2 && stage >= 1) sp.comm_bytes["all_gather"] = psi_bytes / p.dp;
      if (stage == 3) sp.comm_bytes["all_gather"] = 2 * psi_bytes / p.dp * r.accumulation;
      sp.comm_model_multiple = stage == 3 ? 3.0 * r.accumulation : stage == 2 ? 1.0 * r.accumulation + 1 : 2.0;
    }
    if (r.pp > 1) sp.comm_bytes["p2p"] = 2.0 * r.micro_batch * r.seq_len * r.model.hidden_size * c * r.accumulation;
    if (r.device_memory > 0) {
      sp.headroom = static_cast<int64_t>(r.device_memory) - sp.memory.total();
      sp.fits = sp.headroom >= 0;
    }
    p.stages.push_back(sp);
  }

  // Recommendation: the decision tree users know, one reason per step.
  auto total_for = [&](int stage, const std::string& recompute, const std::string& precision) {
    if (bare) return bare_model_states(p.parameters, stage, p.dp, precision).total();
    auto m = model_state_bytes(r.model, stage, p.dp, precision, r.grad_accum_dtype, r.persistence_threshold);
    return m.total() / slice + activation_bytes(r.model, r.micro_batch, r.seq_len, precision, recompute, r.tp, r.pp,
                                               r.fused_attention);
  };
  if (r.device_memory <= 0) {
    p.reasons.push_back("no --device-memory given: showing the numbers without a recommendation");
    return p;
  }
  const double need = static_cast<double>(total_for(0, "none", r.precision));
  const double ratio = need / r.device_memory;
  char line[256];
  std::snprintf(line, sizeof line, "data parallel needs %s per rank, %.2fx the %s device", gb(need).c_str(), ratio,
                gb(r.device_memory).c_str());
  p.reasons.push_back(line);
  if (ratio <= 1) {
    p.recommended_stage = 0;
    p.reasons.push_back("it fits one device: plain data parallelism (stage 0), no sharding overhead");
  } else if (ratio <= 2 && total_for(2, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 2;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by up to 2x: ZeRO-2 shards gradients and optimizer states, bf16 halves weights and "
                        "activations, recomputation keeps one layer's activations");
  } else if (ratio <= 8 && total_for(3, "full", "bf16") <= r.device_memory) {
    p.recommended_stage = 3;
    p.recommended_recompute = "full";
    p.reasons.push_back("short by 2-8x: ZeRO-3 also shards the parameters (1.5x the communication of stage 2)");
  } else {
    p.recommended_stage = 1;
    p.recommended_recompute = "full";
    p.recommended_tp = std::min(8, r.devices);
    p.recommended_pp = std::max(1, r.devices / 8 >= 2 ? std::min(r.devices / 8, 8) : 1);
    p.reasons.push_back("beyond what sharding data-parallel state can save: tensor parallelism within a node (tp=" +
                        std::to_string(p.recommended_tp) + ") splits every layer, pipeline parallelism across nodes (pp=" +
                        std::to_string(p.recommended_pp) + ") splits the layer stack, data parallelism outside");
  }
  return p;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : p.stages) {
    const auto& m = s.memory;
    stages.push_back({{"stage", s.stage},
                      {"compute_params", m.compute_params},
                      {"gradients", m.gradients},
                      {"master_params", m.master_params},
                      {"optimizer_states", m.optimizer_states},
                      {"activations", m.activations},
                      {"recompute_peak", m.recompute_peak},
                      {"comm_buffers", m.comm_buffers},
                      {"gathered_peak", m.gathered_peak},
                      {"total_model_states", m.model_states()},
                      {"total", m.total()},
                      {"fits", s.fits},
                      {"headroom", s.headroom},
                      {"comm_bytes_per_step", s.comm_bytes},
                      {"comm_model_multiple", s.comm_model_multiple}});
  }
  const auto& r = p.request;
  return {{"model", r.model_name},
          {"parameters", p.parameters},
          {"devices", r.devices},
          {"dp", p.dp},
          {"tp", r.tp},
          {"pp", r.pp},
          {"device_memory", r.device_memory},
          {"micro_batch", r.micro_batch},
          {"seq_len", r.seq_len},
          {"accumulation", r.accumulation},
          {"precision", r.precision},
          {"recompute", r.recompute},
          {"activation_method", p.activation_method},
          {"pipeline_bubble", p.pipeline_bubble},
          {"stages", stages},
          {"recommendation",
           {{"zero_stage", p.recommended_stage},
            {"tp", p.recommended_tp},
            {"pp", p.recommended_pp},
            {"recompute", p.recommended_recompute},
            {"reasons", p.reasons}}}};
}

std::string format_plan(const Plan& p) {
  const auto& r = p.request;
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "plan: %s, %.3gB parameters | %d device(s): dp=%d tp=%d pp=%d | %s | micro-batch %lld x seq %lld x accumulation %lld | recompute %s\n",
                r.model_name.c_str(), p.parameters / 1e9, r.devices, p.dp, r.tp, r.pp, r.precision.c_str(),
                static_cast<long long>(r.micro_batch), static_cast<long long>(r.seq_len),
                static_cast<long long>(r.accumulation), r.recompute.c_str());
  out << line << "activations: " << p.activation_method << "\n\n";
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
  row("activations", [](const StagePlan& s) { return s.memory.activations; });
  if (r.recompute != "none") row("recomputed in backward", [](const StagePlan& s) { return s.memory.recompute_peak; });
  row("comm buffers", [](const StagePlan& s) { return s.memory.comm_buffers; });
  row("gathered working set", [](const StagePlan& s) { return s.memory.gathered_peak; });
  row("= total", [](const StagePlan& s) { return s.memory.total(); });
  if (r.device_memory > 0) {
    row("headroom", [](const StagePlan& s) { return s.headroom; });
    out << "fits                ";
    for (const auto& s : p.stages) out << (s.fits ? "          yes" : "           NO");
    out << "\n";
  }
  out << "\ncommunication per step per rank (x model size = algorithmic volume)\n";
  for (const auto& s : p.stages) {
    std::snprintf(line, sizeof line, "  stage %d: %.2fx", s.stage, s.comm_model_multiple);
    out << line;
    for (const auto& [op, bytes] : s.comm_bytes) out << "  " << op << " " << gb(bytes);
    out << "\n";
  }
  if (r.pp > 1) {
    std::snprintf(line, sizeof line, "pipeline bubble (p-1)/(m+p-1) = %.3f\n", p.pipeline_bubble);
    out << line;
  }
  if (r.params_override == 0) {
    std::snprintf(line, sizeof line, "for comparison, Korthikanti et al. 2022 (GPT layer, 16-bit, no recomputation): %s of activations per rank\n",
                  gb(korthikanti_bytes(r.model, r.micro_batch, r.seq_len, r.tp, r.pp)).c_str());
    out << line;
  }
  if (!p.stages.empty() && p.stages[0].stage == 0 && p.dp > 1) {
    const double total = static_cast<double>(p.stages[0].memory.model_states()) * p.dp;
    std::snprintf(line, sizeof line, "data parallel keeps %s of model states in total, %s of it redundant\n",
                  gb(total).c_str(), gb(total - p.stages[0].memory.model_states()).c_str());
    out << line;
  }
  out << "\nrecommendation: zero stage " << p.recommended_stage << ", tp " << p.recommended_tp << ", pp "
      << p.recommended_pp << ", recompute " << p.recommended_recompute << "\n";
  for (const auto& why : p.reasons) out << "  - " << why << "\n";
  return out.str();
}

nlohmann::json recommended_config(const Plan& p) {
  const auto& r = p.request;
  nlohmann::json model = {{"preset", r.model_name}};
  if (r.model_name.empty() || r.model_name.rfind("init:", 0) == 0) model = model::to_hf_json(r.model);
  for (const char* k : {"architectures", "model_type", "torch_dtype"}) model.erase(k);
  nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", r.micro_batch},
                        {"gradient_accumulation_steps", r.accumulation},
                        {"gradient_clipping", 1.0},
                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
                        {"scheduler", {{"type", "WarmupCosineLR"}, {"params", {{"warmup_num_steps", 100}, {"cos_min_ratio", 0.1}}}}},
                        {"model", model},
                        {"data", {{"train", "data/brown/train.bin"}, {"val", "data/brown/val.bin"}, {"seq_len", r.seq_len}}},
                        {"zero_optimization", {{"stage", p.recommended_stage}}},
                        {"activation_checkpointing", {{"mode", p.recommended_recompute}}},
                        {"steps", 1000}};
  if (p.recommended_stage > 0 && r.precision == "bf16") cfg["bf16"] = {{"enabled", true}};
  if (p.recommended_stage > 0 && r.precision == "fp16") cfg["fp16"] = {{"enabled", true}};
  return cfg;
}

}  // namespace shardlm::plan
