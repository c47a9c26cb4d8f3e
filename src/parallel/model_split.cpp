// See model_split.h.
#include "parallel/model_split.h"

#include <ATen/ATen.h>

#include "parallel/tensor/tp_layout.h"

namespace shardlm::parallel {

double ModelSplit::grad_norm_weight(size_t i) const {
  return (tp ? tp->grad_norm_weights()[i] : 1.0) * (pp ? pp->grad_norm_weights()[i] : 1.0) *
         (ep ? ep->grad_norm_weight(i) : 1.0);
}

double ModelSplit::sum_over_model(double weighted_local) const {
  auto total = at::tensor({weighted_local}, at::kDouble);
  if (tp) tp->group()->all_reduce(total);
  if (pp) pp->group()->all_reduce(total);
  if (ep) ep->group()->all_reduce(total);
  return total.item<double>();
}

void ModelSplit::finish(const std::function<at::Tensor()>& embedding_grad) const {
  if (pp && holds(0)) pp->sum_tied_gradients(embedding_grad());
}

std::vector<std::pair<std::string, at::Tensor>> ModelSplit::gather(
    const model::Llama& model, std::vector<std::pair<std::string, at::Tensor>> local,
    const std::vector<char>& only) const {
  if (ep) local = ep->unshard(std::move(local));  // within this (tp, pp) position
  if (pp) {
    const auto& cfg = model.config();
    const auto shape = tp::sharded_shape({model.full_shapes(), {}}, cfg, tp ? tp->size() : 1);
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& [name, dims] : shape.params) shapes.push_back(dims);
    local = pp->gather_to_first(local, shapes, only);
    if (pp->stage() != 0) return local;  // only the first stage's TP group joins the shards
  }
  return tp ? tp->unshard(local, only) : local;
}

std::string ModelSplit::describe_prefix() const {
  std::string s = tp ? tp->describe_prefix() : "";
  if (ep) s += ep->describe_prefix();
  if (pp) s += "pp=" + std::to_string(pp->stages()) + " (stage " + std::to_string(pp->stage()) + ") x ";
  return s;
}

std::vector<std::pair<std::string, comm::CommPtr>> ModelSplit::extra_groups() const {
  auto groups = tp ? tp->extra_groups() : std::vector<std::pair<std::string, comm::CommPtr>>{};
  if (pp && pp->tied_group()) groups.emplace_back("comm_pp_tied_", pp->tied_group());
  return groups;
}

}  // namespace shardlm::parallel
