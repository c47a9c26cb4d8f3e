// See moe.h. Transcribed from transformers 5.23's modeling_mixtral.py and modeling_qwen2_moe.py.
#include "model/moe.h"

#include <ATen/ATen.h>

#include <cmath>
#include <array>
#include <map>
#include <sstream>
#include <regex>

#include "model/context_attention.h"
#include "model/family.h"
#include "model/fp32_products.h"
#include "model/llama_config.h"
#include "util/error.h"

namespace shardlm::model {
namespace {

at::Tensor at_least_float(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? x : x.to(at::kFloat); }

at::Tensor silu_of(const at::Tensor& x) {
  // As llama.cpp's silu_op: CPU fp16 SiLU in fp32, rounded once, as fp16 GPU kernels compute it.
  const bool emulate = x.scalar_type() == at::kHalf && x.is_cpu();
  return emulate ? at::silu(x.to(at::kFloat)).to(at::kHalf) : at::silu(x);
}

// Where at::_grouped_mm computes what model::linear computes: CPU float32 (a plain product), CUDA
// bf16 (fp32 accumulation, one rounding, as cuBLAS). CPU 16-bit products go through model::linear
// (fp32 accumulation emulated, fp32_products.h); float64 has no grouped kernel.
bool grouped_kernel_for(const at::Tensor& rows) {
  if (rows.is_cpu()) return rows.scalar_type() == at::kFloat;
  return rows.is_cuda() && rows.scalar_type() == at::kBFloat16;
}

// transformers' MixtralExperts.forward, operation by operation: per expert hit, the rows routed to
// it (ordered by top-k slot, then token), two products, weighted, index_add into zeros.
at::Tensor experts_loop(const at::Tensor& x, const at::Tensor& gate_up, const at::Tensor& down,
                        const at::Tensor& top_index, const at::Tensor& top_weights) {
  auto out = at::zeros_like(x);
  const int64_t E = gate_up.size(0), I = down.size(2);
  for (int64_t e = 0; e < E; ++e) {
    const auto hit = (top_index == e).t().nonzero();  // [n, 2]: (top-k slot, token), as torch.where(mask[e])
    if (hit.size(0) == 0) continue;
    const auto slot = hit.select(1, 0), token = hit.select(1, 1);
    const auto gu = model::linear(x.index_select(0, token), gate_up.select(0, e));
    const auto h = silu_of(gu.narrow(1, 0, I)) * gu.narrow(1, I, I);
    const auto y = model::linear(h, down.select(0, e));
    const auto w = top_weights.index({token, slot}).unsqueeze(1);
    out = out.index_add(0, token, (y * w).to(x.scalar_type()));
  }
  return out;
}

}  // namespace

at::Tensor grouped_linear(const at::Tensor& rows, const at::Tensor& w, const at::Tensor& offsets,
                          const std::vector<int64_t>& ends) {
  // at::_grouped_mm needs every stride a multiple of 16 bytes: widths of 16 bytes' multiples only.
  const auto aligned = [&](int64_t width) { return width * static_cast<int64_t>(rows.element_size()) % 16 == 0; };
  if (grouped_kernel_for(rows) && aligned(w.size(1)) && aligned(w.size(2)))
    return at::_grouped_mm(rows, w.transpose(1, 2), offsets);
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    if (ends[e] > start) parts.push_back(model::linear(rows.narrow(0, start, ends[e] - start), w.select(0, e)));
    start = ends[e];
  }
  // No rows for any expert: still a product (of 0 rows), so that the result stays connected to rows
  // and w in autograd. Expert parallelism needs it: a rank whose experts received nothing must still
  // run the backward of the all_to_alls that brought (and return) its rows, as its peers do.
  if (parts.empty()) return model::linear(rows, w.select(0, 0));
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

at::Tensor expert_products(const at::Tensor& rows, const std::vector<int64_t>& counts, const at::Tensor& gate_up,
                           const at::Tensor& down) {
  const int64_t I = down.size(2);
  std::vector<int64_t> ends(counts.size());
  int64_t total = 0;
  for (size_t e = 0; e < counts.size(); ++e) ends[e] = total += counts[e];
  std::vector<int32_t> ends32(ends.begin(), ends.end());
  const auto offsets = at::tensor(ends32, at::kInt).to(rows.device());
  const auto gu = grouped_linear(rows, gate_up, offsets, ends);
  const auto h = silu_of(gu.narrow(1, 0, I)) * gu.narrow(1, I, I);
  return grouped_linear(h, down, offsets, ends);
}

namespace {

// The capacity's choice over the N*k assignments sorted by expert (`order`, stable: token order
// within an expert; `flat` each assignment's expert, count[e] per expert): true where an assignment
// is among its expert's first `cap` in the token order of the whole forward. Its place is its place
// among this rank's assignments to the expert plus, under context parallelism, the assignments to it
// of the whole sequence's earlier positions held elsewhere (this rank's chunks, each its own run of
// `positions / 2` positions, sit in sequence order within a row: chunk r before chunk 2c-1-r).
at::Tensor capacity_keep(const at::Tensor& order, const at::Tensor& flat, const std::vector<int64_t>& count, int64_t k,
                         int64_t cap, const SequenceShards& shards) {
  const int64_t E = static_cast<int64_t>(count.size()), M = order.numel();
  const auto on = order.options();
  const auto expert = flat.index_select(0, order);
  std::vector<int64_t> start(count.size(), 0);
  for (size_t e = 1; e < count.size(); ++e) start[e] = start[e - 1] + count[e - 1];
  auto place = at::arange(M, on) - at::tensor(start, at::kLong).to(order.device()).index_select(0, expert);
  if (shards.context) {
    const int64_t half = shards.positions / 2, groups = M / k / half;  // [rows x 2 chunks]
    const auto group = order.div(k, "floor").div(half, "floor");
    const auto here = at::bincount(group * E + expert, {}, groups * E).to(at::kLong).view({groups, E});
    const auto before = shards.context->assignments_before(here.view({groups / 2, 2, E})).view({groups, E});
    const auto shift = before - (here.cumsum(0) - here);  // earlier positions elsewhere
    place = place + shift.view({-1}).index_select(0, group * E + expert);
  }
  return place.lt(cap);
}

}  // namespace

at::Tensor moe_block(const at::Tensor& x, const MoeWeights& w, const LlamaConfig& cfg, int64_t layer,
                     at::Tensor* router_logits_out, ExpertCompute compute, ExpertDispatch* dispatch,
                     std::vector<int64_t>* expert_counts, const SequenceShards& shards) {
  // E: every expert of the layer (the router's rows); gate_up / down may hold only some of them
  // (expert parallelism: the dispatch reaches the others).
  const int64_t N = x.size(0), E = w.router.size(0), k = cfg.num_experts_per_tok;
  if (!dispatch && w.gate_up.size(0) != E)
    fail("layer ", layer, ": this rank holds ", w.gate_up.size(0), " of the ", E, " experts but no expert dispatch "
         "reaches the others (internal error: expert parallelism installs one)");
  // Router (MixtralTopKRouter / Qwen2MoeTopKRouter): logits in x's dtype, softmax in float32, top-k,
  // renormalised (mixtral always; qwen2_moe when norm_topk_prob). Mixtral keeps the weights in
  // float32; Qwen2-MoE casts them back to the logits' dtype.
  const auto logits = model::linear(x, w.router);
  if (router_logits_out) *router_logits_out = logits;
  const auto probs = at::softmax(at_least_float(logits), -1);
  if (!at::isfinite(probs).all().item<bool>())
    fail("layer ", layer, ": the MoE router produced NaN or infinite probabilities (its logits are not finite: the "
         "hidden states or the router weights model.layers.", layer,
         ".mlp.gate.weight hold NaN/inf, or the loss diverged); top-k routing over them is undefined. Check the "
         "weights for NaN (a diverged or corrupted checkpoint) or lower the learning rate");
  auto [top_values, top_index] = at::topk(probs, k, -1);
  const Family& fam = cfg.family();
  if (fam.always_renormalise || cfg.norm_topk_prob) top_values = top_values / top_values.sum(-1, true);
  if (!fam.router_weights_float32) top_values = top_values.to(logits.scalar_type());

  at::Tensor routed;
  if (compute == ExpertCompute::Loop && cfg.moe_capacity_factor == 0 && !dispatch) {
    routed = experts_loop(x, w.gate_up, w.down, top_index, top_values);
    if (expert_counts) {
      const auto c = at::bincount(top_index.reshape({-1}), {}, E).to(at::kLong).cpu();
      expert_counts->assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + E);
      expert_counts->push_back(0);
    }
  } else {
    // Sort the N*k (token, slot) assignments by expert (stable: token order within an expert).
    const auto flat = top_index.reshape({-1});
    auto order = std::get<1>(at::sort(flat, /*stable=*/true, 0, false));
    auto counts = at::bincount(flat, {}, E).to(at::kLong).cpu();
    std::vector<int64_t> count(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + E);
    int64_t dropped = 0;
    if (cfg.moe_capacity_factor > 0) {
      // GShard capacity: each expert keeps its first `cap` assignments in token order; the rest add
      // nothing. Applied where the tokens are (before any dispatch), over this forward's tokens (under
      // context parallelism every rank's: the whole sequences).
      const int64_t parts = shards.context ? shards.context->ranks() : 1;
      const auto cap = static_cast<int64_t>(std::ceil(cfg.moe_capacity_factor * static_cast<double>(N * parts * k) /
                                                      static_cast<double>(E)));
      const auto keep = capacity_keep(order, flat, count, k, cap, shards);
      order = order.masked_select(keep);
      const auto kept = at::bincount(flat.index_select(0, order), {}, E).to(at::kLong).cpu();
      for (int64_t e = 0; e < E; ++e) {
        dropped += count[e] - kept.data_ptr<int64_t>()[e];
        count[e] = kept.data_ptr<int64_t>()[e];
      }
    }
    if (expert_counts) {
      *expert_counts = count;
      expert_counts->push_back(dropped);
    }
    const auto token = order.div(k, "floor");
    const auto rows = x.index_select(0, token);
    const auto y = dispatch ? dispatch->experts(rows, count, w.gate_up, w.down, layer)
                            : expert_products(rows, count, w.gate_up, w.down);
    const auto weights = top_values.reshape({-1}).index_select(0, order).unsqueeze(1);
    routed = at::zeros_like(x).index_add(0, token, (y * weights).to(x.scalar_type()));
  }
  if (!w.shared_gate.defined()) return routed;
  // Qwen2MoeSparseMoeBlock: + sigmoid(shared_expert_gate(x)) * shared_expert(x).
  const auto shared = model::linear(silu_of(model::linear(x, w.shared_gate)) * model::linear(x, w.shared_up), w.shared_down);
  return routed + at::sigmoid(model::linear(x, w.shared_expert_gate)) * shared;
}

at::Tensor load_balancing_sums(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  if (router_logits.empty()) fail("load_balancing_loss: no router logits (a model without sparse layers)");
  // load_balancing_loss_func (no attention mask): counts and probability sums over all layers'
  // rows, in float32 (float64 for a float64 model), normalised once at the end.
  const auto acc = router_logits[0].scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto tokens = at::zeros({num_experts}, router_logits[0].options().dtype(acc));
  at::Tensor probs_sum;
  double rows = 0;
  for (const auto& logits : router_logits) {
    const auto routing = at::softmax(logits, -1);  // in the logits' dtype, as there
    const auto selected = std::get<1>(at::topk(routing, top_k, -1));
    tokens = tokens + at::bincount(selected.reshape({-1}), {}, num_experts).to(acc);
    const auto p = routing.to(acc).sum(0);
    probs_sum = probs_sum.defined() ? probs_sum + p : p;
    rows += static_cast<double>(routing.size(0));
  }
  return at::cat({tokens, probs_sum, at::full({1}, rows, tokens.options())});
}

at::Tensor load_balancing_loss_from_sums(const at::Tensor& sums, int64_t num_experts) {
  const auto tokens = sums.narrow(0, 0, num_experts).detach(), probs_sum = sums.narrow(0, num_experts, num_experts);
  const auto rows = sums.narrow(0, 2 * num_experts, 1).detach();
  return (tokens / rows * (probs_sum / rows).unsqueeze(0)).sum() * static_cast<double>(num_experts);
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k) {
  return load_balancing_loss_from_sums(load_balancing_sums(router_logits, num_experts, top_k), num_experts);
}

namespace {

// The per-expert file names of a family (model/family.h): (gate, up, down) suffixes after
// "experts.N.", and the block's prefix in files ("mlp" or mixtral's "block_sparse_moe").
ExpertFileNames expert_file_names(const LlamaConfig& cfg) { return cfg.family().expert_files; }

}  // namespace

NamedTensorList fuse_expert_tensors(const LlamaConfig& cfg, const NamedTensorList& tensors,
                                    std::vector<std::string>& problems) {
  if (!cfg.is_moe()) return tensors;
  const auto names = expert_file_names(cfg);
  // (layer, expert) -> gate/up/down
  std::map<int64_t, std::map<int64_t, std::array<at::Tensor, 3>>> experts;
  const std::regex per_expert(std::string(R"(model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+\.weight))"));
  NamedTensorList out;
  for (const auto& [name, t] : tensors) {
    std::smatch m;
    if (std::regex_match(name, m, per_expert)) {
      const int64_t layer = std::stoll(m[1]), e = std::stoll(m[2]);
      const std::string part = m[3];
      const int which = part == names.gate ? 0 : part == names.up ? 1 : part == names.down ? 2 : -1;
      if (which >= 0 && layer < cfg.num_hidden_layers && cfg.is_moe_layer(layer) && e < cfg.num_experts &&
          name.find(std::string(".") + names.block + ".") != std::string::npos) {
        experts[layer][e][static_cast<size_t>(which)] = t;
        continue;
      }
    }
    std::string renamed = name;
    if (std::string(names.block) != "mlp") {  // transformers' WeightRenaming(".block_sparse_moe.", ".mlp.")
      const std::string block = std::string(".") + names.block + ".";
      const auto at_block = renamed.find(block);
      if (at_block != std::string::npos) renamed.replace(at_block, block.size(), ".mlp.");
    }
    out.emplace_back(renamed, t);
  }
  const int64_t H = cfg.hidden_size, I = cfg.expert_intermediate_size();
  for (auto& [layer, by_expert] : experts) {
    const std::string prefix = "model.layers." + std::to_string(layer) + "." + names.block + ".experts.";
    bool complete = true;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      const std::array<const char*, 3> part = {names.gate, names.up, names.down};
      const std::array<std::vector<int64_t>, 3> shape = {std::vector<int64_t>{I, H}, {I, H}, {H, I}};
      for (size_t j = 0; j < 3; ++j) {
        auto it = by_expert.find(e);
        const at::Tensor* t = it == by_expert.end() ? nullptr : &it->second[j];
        const std::string n = prefix + std::to_string(e) + "." + part[j];
        if (!t || !t->defined()) {
          problems.push_back("missing tensor " + n + " (layer " + std::to_string(layer) + " has other experts' "
                             "tensors; it needs all " + std::to_string(cfg.num_experts) + ")");
          complete = false;
        } else if (t->sizes() != at::IntArrayRef(shape[j])) {
          std::ostringstream s;
          s << "tensor " << n << " has shape " << t->sizes() << ", the model config needs " << at::IntArrayRef(shape[j]);
          problems.push_back(s.str());
          complete = false;
        }
      }
    }
    if (!complete) continue;
    std::vector<at::Tensor> gate, up, down;
    for (auto& [e, parts] : by_expert) {
      gate.push_back(parts[0]);
      up.push_back(parts[1]);
      down.push_back(parts[2]);
    }
    const std::string fused = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    out.emplace_back(fused + "gate_up_proj", at::cat({at::stack(gate), at::stack(up)}, 1));
    out.emplace_back(fused + "down_proj", at::stack(down));
  }
  return out;
}

std::vector<FileSlice> hf_file_slices(const LlamaConfig& cfg, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  if (!cfg.is_moe()) return {{name, shape, 0}};
  const auto names = expert_file_names(cfg);
  const std::regex fused(R"(model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj))");
  const std::regex router(R"(model\.layers\.(\d+)\.mlp\.gate\.weight)");
  std::smatch m;
  if (std::regex_match(name, m, fused) && shape.size() == 3) {
    const std::string prefix = "model.layers." + std::string(m[1]) + "." + names.block + ".experts.";
    const int64_t per_expert = shape[1] * shape[2];
    std::vector<FileSlice> out;
    for (int64_t e = 0; e < shape[0]; ++e) {
      const std::string p = prefix + std::to_string(e) + ".";
      if (m[2] == "gate_up_proj") {  // [gate; up] rows of expert e
        const int64_t I = shape[1] / 2;
        out.push_back({p + names.gate, {I, shape[2]}, e * per_expert});
        out.push_back({p + names.up, {I, shape[2]}, e * per_expert + I * shape[2]});
      } else {
        out.push_back({p + names.down, {shape[1], shape[2]}, e * per_expert});
      }
    }
    return out;
  }
  if (std::string(names.block) != "mlp" && std::regex_match(name, m, router))
    return {{"model.layers." + std::string(m[1]) + "." + names.block + ".gate.weight", shape, 0}};
  return {{name, shape, 0}};
}

NamedTensorList split_expert_tensors(const LlamaConfig& cfg, const NamedTensorList& tensors) {
  NamedTensorList out;
  for (const auto& [name, t] : tensors) {
    const auto slices = hf_file_slices(cfg, name, t.sizes().vec());
    if (slices.size() == 1 && slices[0].name == name) {
      out.emplace_back(name, t);
      continue;
    }
    const auto flat = t.contiguous().view({-1});
    for (const auto& sl : slices) {
      int64_t numel = 1;
      for (auto d : sl.shape) numel *= d;
      out.emplace_back(sl.name, flat.narrow(0, sl.begin, numel).view(sl.shape).clone());
    }
  }
  return out;
}

}  // namespace shardlm::model
