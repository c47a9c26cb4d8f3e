// AdamW with torch.optim.AdamW's exact arithmetic (single-tensor path of torch 1.13): decoupled
// weight decay p -= lr*wd*p, moments updated in place, bias corrections in double precision,
// eps added after the square root of the corrected second moment. The same class runs the other
// update rules of DeepSpeed's optimizer types (runtime/engine.py _configure_basic_optimizer, pinned
// 0.19.8): `Adam` with adam_w_mode=false (FusedAdam's ADAM_MODE_0, torch.optim.Adam: L2 weight decay
// added to the gradient), bias_correction=false (FusedAdam and FusedLamb), and `Lamb` (FusedLamb,
// csrc/lamb/fused_lamb_cuda_kernel.cu: a per-segment trust ratio ||p|| / ||update|| clamped to
// [min_coeff, max_coeff]; its segments must be whole parameters, which train/config_ranges.cpp
// ensures by refusing Lamb with ZeRO or tensor parallelism).
//
// Moments may be kept compact (optimizer.state_precision, quantized_state.h): bf16, or bitsandbytes'
// 8-bit block-wise quantization (AdamW8bit). Compact moments are dequantized, updated in fp32 with the
// same rule element by element (adamw.cpp step_compact), and stored back; the parameter update uses
// the fp32 values before they are stored, as bitsandbytes and torchao do.
//
// Masters may be bf16 (optimizer.master_precision, master_format.h): the segments then hold the bf16
// working shard itself, every segment takes the element-by-element path of step_compact, and the fp32
// result returns to bf16 by round-to-nearest, Kahan summation (a bf16 compensation buffer per segment,
// optimizer state like the moments) or stochastic rounding.
//
// The optimizer works on "segments" — (parameter, gradient) tensor pairs with a weight-decay flag —
// so the same code updates whole parameters (data parallel) or pieces of flat fp32 shards (ZeRO).
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "optim/master_format.h"
#include "optim/quantized_state.h"

namespace shardlm::optim {

// The update rule: AdamW (decoupled decay), Adam with L2 decay in the gradient, or Lamb.
enum class UpdateRule { AdamW, AdamL2, Lamb };

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  UpdateRule rule = UpdateRule::AdamW;
  bool bias_correction = true;   // false: moments used as they are (DeepSpeed's bias_correction=false)
  double max_coeff = 10.0, min_coeff = 0.01;  // Lamb: the trust ratio's clamp (FusedLamb's defaults)
  bool eps_inside_sqrt = false;  // Lamb: sqrt(v + eps) instead of sqrt(v) + eps
  StatePrecision state_precision = StatePrecision::FP32;  // how the moments are stored
  int64_t min_8bit_size = kDefaultMin8bitSize;  // 8-bit: parameters smaller than this keep fp32 moments
  MasterRounding masters = MasterRounding::None;  // None: fp32 masters; else bf16 masters rounded so
  uint64_t seed = 0;                              // stochastic rounding's stream (master_format.h)
};

struct Segment {
  std::string name;   // for checkpoints and error messages
  at::Tensor param;   // float32, updated in place
  at::Tensor grad;    // same shape as param
  bool decay = true;  // weight decay applies (torch recipes: tensors with 2+ dimensions)
  // Where the segment lies in its parameter (ZeRO slices): 8-bit blocks count from the parameter's
  // element 0, and whether it is quantized at all depends on the whole parameter's size.
  int64_t param_offset = 0;
  int64_t param_numel = -1;  // -1: the segment is the whole parameter
  // Stochastic rounding: the segment's element 0 in the whole (unsplit) parameter, which names the
  // random stream together with the part of `name` before any '@'; -1: param_offset.
  int64_t stream_offset = -1;
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
  const AdamWOptions& options() const { return opt_; }
  // exp_avg / exp_avg_sq per segment, named "<segment>.exp_avg" etc, for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  void load_state(const std::map<std::string, at::Tensor>& state, int64_t step);
  // Segment i's moments (sharded checkpoints write them and load into them in place).
  const at::Tensor& exp_avg(size_t i) const { return exp_avg_[i]; }
  const at::Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_[i]; }
  void set_steps_taken(int64_t step) { step_ = step; }
  // The format segment i's moments are kept in (8-bit: FP32 for parameters under min_8bit_size).
  StatePrecision format(size_t i) const { return format_[i]; }
  // Kahan summation over bf16 masters: segment i's bf16 compensation buffer; undefined otherwise.
  const at::Tensor& compensation(size_t i) const { return compensation_[i]; }
  // 8-bit segments: one float32 absmax per quantization block the segment touches, per moment.
  const at::Tensor& absmax(size_t i, bool second_moment) const { return second_moment ? absmax2_[i] : absmax1_[i]; }
  // Sharded 8-bit states: a quantization block that a shard boundary cuts has parts on several
  // ranks, whose absmax must be the block's. slots[i] = {slot of segment i's first block, of its
  // last block} (-1: the block lies wholly in the segment); each step fills a float tensor [2·count]
  // with this rank's largest |exp_avg|, |exp_avg_sq| per slot and `reduce_max` takes the maximum
  // over the ranks in place, so every rank quantizes the block with the same absmax.
  void set_shared_blocks(std::vector<std::pair<int64_t, int64_t>> slots, int64_t count,
                         std::function<void(const at::Tensor&)> reduce_max);
  // Bytes of optimizer state held (both moments, with 8-bit block absmax values).
  int64_t state_bytes() const;
  // Lamb: the trust ratio each segment used in the last step (FusedLamb's get_lamb_coeffs).
  const std::vector<double>& lamb_coeffs() const { return lamb_coeffs_; }

  // A step in pieces, for states the caller holds between steps (NVMe offload,
  // parallel/zero/state_offload.h): begin_step(); where 8-bit blocks are shared between ranks,
  // collect_shared_maxima over the pieces holding them and reduce_shared_maxima(); then
  // step_pieces over every element once, in any grouping. step() is exactly these over whole
  // segments, so the pieces update bit for bit as it does (the arithmetic is element by element).
  // Pieces of 8-bit segments must be cut on quantization-block boundaries of the parameter.
  struct Piece {
    size_t segment = 0;
    int64_t begin = 0, numel = 0;  // elements [begin, begin + numel) of the segment
    at::Tensor param;              // 1-D fp32 master elements of the piece
    at::Tensor exp_avg, exp_avg_sq;  // 1-D, the segment's format
    at::Tensor absmax1, absmax2;     // 8-bit: one per block the piece touches
    at::Tensor compensation;         // Kahan summation over bf16 masters, else undefined
  };
  void begin_step();
  bool shares_blocks(const Piece& p) const;  // the piece holds a block shared between ranks
  void collect_shared_maxima(const std::vector<Piece>& pieces, const std::vector<double>* grad_multipliers);
  void reduce_shared_maxima();
  void step_pieces(double lr, const std::vector<double>* grad_multipliers, const std::vector<Piece>& pieces);
  // The piece of segment i over the state held here (whole: begin 0, all elements).
  Piece resident_piece(size_t i) const;
  // Offload: segment i's moments (and absmax, and Kahan's compensation) are held elsewhere from now on
  // (undefined here), or held here again; with drop_param its master too (a master the caller pages:
  // a separate fp32 one, or a bf16 one in host memory apart from the device).
  void drop_state(size_t i, bool drop_param);
  void adopt_state(size_t i, at::Tensor param, at::Tensor exp_avg, at::Tensor exp_avg_sq, at::Tensor absmax1,
                   at::Tensor absmax2, at::Tensor compensation = at::Tensor());
  // Whether segment i keeps a Kahan compensation buffer (bf16 masters, master_rounding "kahan"), held
  // here or not.
  bool kahan() const { return opt_.masters == MasterRounding::Kahan; }

 private:
  void step_lamb(double lr, const std::vector<double>* grad_multipliers);
  void step_compact(double lr, const std::vector<double>* grad_multipliers, const std::vector<Piece>& pieces);
  // Whether segment i steps element by element (compact moments or bf16 masters) rather than by
  // the library's multi-tensor ops.
  bool elementwise(size_t i) const { return format_[i] != StatePrecision::FP32 || opt_.masters != MasterRounding::None; }
  std::vector<at::Tensor> compensation_;  // Kahan: bf16 per segment; undefined otherwise
  std::vector<uint32_t> stream_name_;     // stochastic rounding: FNV-1a of each segment's parameter name
  at::Tensor shared_;  // this step's absmax of the shared blocks [2 x shared_count_]
  std::vector<StatePrecision> format_;
  std::vector<at::Tensor> absmax1_, absmax2_;  // 8-bit segments; undefined otherwise
  std::vector<std::pair<int64_t, int64_t>> shared_slots_;
  int64_t shared_count_ = 0;
  std::function<void(const at::Tensor&)> reduce_max_;
  std::vector<double> lamb_coeffs_;
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
