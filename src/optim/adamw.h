// AdamW with torch.optim.AdamW's exact arithmetic (single-tensor path of torch 1.13): decoupled
// weight decay p -= lr*wd*p, moments updated in place, bias corrections in double precision,
// eps added after the square root of the corrected second moment.
//
// The optimizer works on "segments" — (parameter, gradient) tensor pairs with a weight-decay flag —
// so the same code updates whole parameters (data parallel) or pieces of flat fp32 shards (ZeRO).
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace shardlm::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct Segment {
  std::string name;   // for checkpoints and error messages
  at::Tensor param;   // float32, updated in place
  at::Tensor grad;    // same shape as param
  bool decay = true;  // weight decay applies (torch recipes: tensors with 2+ dimensions)
};

class AdamW {
 public:
  AdamW(std::vector<Segment> segments, AdamWOptions options);
  // One update with learning rate `lr` (the schedule's value for this step). grad_multipliers,
  // when given, holds one factor per segment applied to its gradient in the master's precision
  // (fp16 loss scaling: unscaling in fp16 would flush small gradients to zero).
  void step(double lr, const std::vector<double>* grad_multipliers = nullptr);
  int64_t steps_taken() const { return step_; }
  const std::vector<Segment>& segments() const { return segments_; }
  // exp_avg / exp_avg_sq per segment, named "<segment>.exp_avg" etc, for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state, int64_t step);
  // Segment i's moments (sharded checkpoints write them and load into them in place).
  const at::Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const at::Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }
  void set_steps_taken(int64_t step) { step_ = step; }
  // Bytes of optimizer state held (both moments).
  int64_t state_bytes() const;

 private:
  std::vector<Segment> segments_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  AdamWOptions opt_;
  int64_t step_ = 0;
};

// torch.nn.utils.clip_grad_norm_ semantics on a set of gradients. `sum_of_squares` is this rank's
// contribution; the caller reduces it across ranks that hold disjoint pieces (ZeRO) or not at all
// (replicated gradients). Returns the norm before clipping.
// `weights` (one per grad, optional) multiplies each grad's squared norm (tensor parallelism counts a
// tensor replicated on k ranks with weight 1/k).
double local_grad_sum_of_squares(const std::vector<at::Tensor>& grads, const std::vector<double>* weights = nullptr);
// Scales every grad by min(1, max_norm / (total_norm + 1e-6)) exactly as torch does (always
// multiplies, also by 1.0). max_norm <= 0 disables clipping.
void clip_grads(const std::vector<at::Tensor>& grads, double total_norm, double max_norm);

}  // namespace shardlm::optim
