// See adamw.h. Mirrors torch/optim/adamw.py (_single_tensor_adamw; _multi_tensor_adamw does the same
// operations over lists) operation by operation, because the golden tests compare against it at 1e-6.
#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>
#include <type_traits>

#include "util/error.h"

namespace shardlm::optim {

AdamW::AdamW(std::vector<Segment> segments, AdamWOptions options) : segments_(std::move(segments)), opt_(options) {
  const auto precision = opt_.state_precision;
  if (precision != StatePrecision::FP32 && opt_.rule == UpdateRule::Lamb)
    fail("optimizer.state_precision \"", state_precision_name(precision), "\" with optimizer.type \"Lamb\" is not "
         "built (compact moments exist for Adam and AdamW); use optimizer.state_precision \"fp32\" or optimizer.type "
         "\"AdamW\"");
  const bool bf16_masters = opt_.masters != MasterRounding::None;
  if (bf16_masters && opt_.rule == UpdateRule::Lamb)
    fail("optimizer.master_precision \"bf16\" with optimizer.type \"Lamb\" is not built (bf16 masters exist for "
         "Adam and AdamW); use optimizer.master_precision \"fp32\" or optimizer.type \"AdamW\"");
  for (const auto& s : segments_) {
    if (bf16_masters) {
      if (s.param.scalar_type() != at::kBFloat16 || !s.param.is_contiguous() || !s.param.is_cpu())
        fail("AdamW: optimizer.master_precision \"bf16\" needs contiguous bf16 master weights in host memory; "
             "segment ", s.name, " holds ", s.param.scalar_type(), " on ", s.param.device(),
             " (bf16 masters run under bf16.enabled, on a GPU through zero_optimization.offload_optimizer.device "
             "\"cpu\" or \"nvme\", whose masters are host memory)");
      compensation_.push_back(opt_.masters == MasterRounding::Kahan ? at::zeros_like(s.param) : at::Tensor());
      stream_name_.push_back(fnv1a32(s.name.substr(0, s.name.find('@'))));
    } else if (s.param.scalar_type() != at::kFloat && s.param.scalar_type() != at::kDouble) {
      fail("AdamW: segment ", s.name, " must hold float32 (or float64) master weights");
    } else {
      compensation_.emplace_back();
      stream_name_.push_back(0);
    }
    const int64_t whole = s.param_numel < 0 ? s.param.numel() : s.param_numel;
    auto format = precision == StatePrecision::Int8 && whole < opt_.min_8bit_size ? StatePrecision::FP32 : precision;
    if (format != StatePrecision::FP32 && !bf16_masters && (s.param.scalar_type() != at::kFloat || !s.param.is_contiguous()))
      fail("AdamW: optimizer.state_precision \"", state_precision_name(precision), "\" needs contiguous float32 "
           "master weights; segment ", s.name, " holds ", s.param.scalar_type());
    if (format != StatePrecision::FP32 && !s.param.is_cpu())
      fail("optimizer.state_precision \"", state_precision_name(precision), "\" runs on the CPU only so far (its "
           "update is host code); the masters of ", s.name, " are on ", s.param.device(),
           "; use optimizer.state_precision \"fp32\" on a GPU");
    format_.push_back(format);
    if (format == StatePrecision::Int8) {
      // Codes of 0 with absmax 0 dequantize to 0: the zero moments Adam starts from.
      const int64_t blocks = blocks_touched(s.param_offset, s.param.numel());
      exp_avg_.push_back(at::full(s.param.sizes(), Quantizer(true).quantize(0.0f, 0.0f), s.param.options().dtype(at::kByte)));
      exp_avg_sq_.push_back(at::full(s.param.sizes(), Quantizer(false).quantize(0.0f, 0.0f), s.param.options().dtype(at::kByte)));
      absmax1_.push_back(at::zeros({blocks}, s.param.options().dtype(at::kFloat)));
      absmax2_.push_back(at::zeros({blocks}, s.param.options().dtype(at::kFloat)));
    } else {
      const auto dtype = format == StatePrecision::BF16 ? at::kBFloat16 : bf16_masters ? at::kFloat : s.param.scalar_type();
      exp_avg_.push_back(at::zeros_like(s.param, s.param.options().dtype(dtype)));
      exp_avg_sq_.push_back(at::zeros_like(s.param, s.param.options().dtype(dtype)));
      absmax1_.emplace_back();
      absmax2_.emplace_back();
    }
  }
  shared_slots_.assign(segments_.size(), {-1, -1});
}

void AdamW::set_shared_blocks(std::vector<std::pair<int64_t, int64_t>> slots, int64_t count,
                              std::function<void(const at::Tensor&)> reduce_max) {
  if (slots.size() != segments_.size()) fail("internal: set_shared_blocks needs one slot pair per segment");
  shared_slots_ = std::move(slots);
  shared_count_ = count;
  reduce_max_ = std::move(reduce_max);
}

namespace {

// Segments are updated in groups with the library's multi-tensor (_foreach_) ops: on a GPU one
// kernel launch covers many tensors; on the CPU each op runs tensor by tensor, the same
// arithmetic as a loop. A group is cut where the fp32 copies of 16-bit gradients it needs would
// exceed this many elements, so the update never holds a full fp32 gradient copy.
constexpr int64_t kMaxConvertedElements = int64_t{1} << 26;

}  // namespace

void AdamW::step(double lr, const std::vector<double>* grad_multipliers) {
  at::NoGradGuard no_grad;
  if (opt_.rule == UpdateRule::Lamb) return step_lamb(lr, grad_multipliers);
  std::vector<Piece> all;
  for (size_t i = 0; i < segments_.size(); ++i) all.push_back(resident_piece(i));
  begin_step();
  if (shared_count_ > 0) {
    collect_shared_maxima(all, grad_multipliers);
    reduce_shared_maxima();
  }
  step_pieces(lr, grad_multipliers, all);
}

AdamW::Piece AdamW::resident_piece(size_t i) const {
  Piece p;
  p.segment = i;
  p.numel = segments_[i].param.numel();
  p.param = segments_[i].param;
  p.exp_avg = exp_avg_[i];
  p.exp_avg_sq = exp_avg_sq_[i];
  p.absmax1 = absmax1_[i];
  p.absmax2 = absmax2_[i];
  p.compensation = compensation_[i];
  return p;
}

void AdamW::begin_step() {
  ++step_;
  if (shared_.defined()) shared_.zero_();  // this step collects the shared blocks' maxima afresh
}

void AdamW::drop_state(size_t i, bool drop_param) {
  exp_avg_[i] = at::Tensor();
  exp_avg_sq_[i] = at::Tensor();
  absmax1_[i] = at::Tensor();
  absmax2_[i] = at::Tensor();
  compensation_[i] = at::Tensor();
  if (drop_param) segments_[i].param = at::Tensor();
}

void AdamW::adopt_state(size_t i, at::Tensor param, at::Tensor exp_avg, at::Tensor exp_avg_sq, at::Tensor absmax1,
                        at::Tensor absmax2, at::Tensor compensation) {
  if (kahan() != compensation.defined())
    fail("internal: segment ", segments_[i].name, kahan() ? " needs" : " takes no", " Kahan compensation");
  if (param.defined()) segments_[i].param = std::move(param);
  compensation_[i] = std::move(compensation);
  exp_avg_[i] = std::move(exp_avg);
  exp_avg_sq_[i] = std::move(exp_avg_sq);
  absmax1_[i] = std::move(absmax1);
  absmax2_[i] = std::move(absmax2);
}

void AdamW::step_pieces(double lr, const std::vector<double>* grad_multipliers, const std::vector<Piece>& pieces) {
  at::NoGradGuard no_grad;
  if (opt_.rule == UpdateRule::Lamb) fail("internal: Lamb's trust ratio needs whole segments; it cannot step in pieces");
  // bias_correction=false (DeepSpeed's FusedAdam option): the moments are used uncorrected.
  const double bias_correction1 = opt_.bias_correction ? 1.0 - std::pow(opt_.beta1, static_cast<double>(step_)) : 1.0;
  const double bias_correction2 = opt_.bias_correction ? 1.0 - std::pow(opt_.beta2, static_cast<double>(step_)) : 1.0;
  // Adam with L2 regularization (torch.optim.Adam, FusedAdam's ADAM_MODE_0): the decay term joins
  // the gradient before the moments see it, instead of shrinking the weights (AdamW).
  const bool l2 = opt_.rule == UpdateRule::AdamL2 && opt_.weight_decay != 0;
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  size_t begin = 0;
  while (begin < pieces.size()) {
    std::vector<at::Tensor> params, grads, avgs, avg_sqs, decayed;
    int64_t converted = 0;
    size_t k = begin;
    for (; k < pieces.size(); ++k) {
      const auto& piece = pieces[k];
      const size_t i = piece.segment;
      if (elementwise(i)) continue;  // step_compact below
      const auto& param = piece.param;
      // Mixed precision keeps 16-bit gradients next to fp32 master weights: update in the master's dtype.
      const bool whole = piece.begin == 0 && piece.numel == segments_[i].grad.numel();
      const auto raw_grad = whole ? segments_[i].grad : segments_[i].grad.view({-1}).narrow(0, piece.begin, piece.numel);
      const double multiplier = grad_multipliers ? (*grad_multipliers)[i] : 1.0;
      const bool add_l2 = l2 && segments_[i].decay;
      const bool convert = raw_grad.scalar_type() != param.scalar_type() || multiplier != 1.0 || add_l2;
      if (convert && converted > 0 && converted + raw_grad.numel() > kMaxConvertedElements) break;
      auto grad = raw_grad.scalar_type() == param.scalar_type() ? raw_grad : raw_grad.to(param.scalar_type());
      if (multiplier != 1.0) grad = grad * multiplier;
      if (add_l2) grad = grad.add(param, opt_.weight_decay);  // torch.optim.Adam: grad.add(param, alpha=wd)
      if (convert) converted += grad.numel();
      params.push_back(param);
      grads.push_back(grad);
      avgs.push_back(piece.exp_avg);
      avg_sqs.push_back(piece.exp_avg_sq);
      if (segments_[i].decay) decayed.push_back(param);
    }
    begin = k;
    if (params.empty()) continue;
    if (!decayed.empty() && opt_.rule == UpdateRule::AdamW) at::_foreach_mul_(decayed, 1.0 - lr * opt_.weight_decay);
    at::_foreach_mul_(avgs, opt_.beta1);
    at::_foreach_add_(avgs, grads, 1.0 - opt_.beta1);
    at::_foreach_mul_(avg_sqs, opt_.beta2);
    at::_foreach_addcmul_(avg_sqs, grads, grads, 1.0 - opt_.beta2);
    auto denoms = at::_foreach_sqrt(avg_sqs);
    at::_foreach_div_(denoms, bias_correction2_sqrt);
    at::_foreach_add_(denoms, opt_.eps);
    at::_foreach_addcdiv_(params, avgs, denoms, -step_size);
  }
  step_compact(lr, grad_multipliers, pieces);
}

// Compact moments, element by element in float32 (plain scalar code: the result of an element does
// not depend on where vector lanes fall, so a ZeRO slice updates exactly as the whole parameter):
//   g (× multiplier; + wd·p with L2);  p ← p·(1 − lr·wd) (AdamW);
//   m ← m·β1 + (1−β1)·g;  v ← v·β2 + (1−β2)·g·g;  p ← p − lr/bc1 · m / (√v / √bc2 + eps)
// — torch's AdamW and bitsandbytes' CPU 8-bit update, with m, v the stored values dequantized (8-bit:
// code value × block absmax; bf16: widened). The updated m, v are then stored: rounded to bf16, or
// quantized against their block's new absmax (quantized_state.h).
namespace {

struct CompactRule {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bc2_sqrt, neg_step, decay_factor, wd;
  bool decoupled, l2;
  // The gradient as the moments see it.
  float grad(float g, float multiplier, bool scaled, float p, bool decay) const {
    if (scaled) g = g * multiplier;
    if (l2 && decay) g = g + wd * p;
    return g;
  }
  void moments(float g, float& m, float& v) const {
    m = m * beta1 + one_minus_beta1 * g;
    v = v * beta2 + one_minus_beta2 * g * g;
  }
  float update(float m, float v) const {
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    return neg_step * (m / denom);
  }
  float param(float p, float m, float v, bool decay) const {
    if (decoupled && decay) p = p * decay_factor;
    return p + update(m, v);
  }
};

// A piece's master weights as the element-by-element update reads and writes them: fp32 masters in
// place; bf16 masters (optimizer.master_precision) rounded back as optimizer.master_rounding says
// (master_format.h: torchdistx's Kahan summation, torchao's stochastic rounding, or nearest).
struct Masters {
  float* f32 = nullptr;
  c10::BFloat16* b16 = nullptr;
  c10::BFloat16* comp = nullptr;  // Kahan compensation
  MasterRounding rounding = MasterRounding::None;
  uint64_t seed = 0;
  int64_t step = 0, first = 0;  // first: the piece's element 0 in the whole parameter
  uint32_t name = 0;
  float get(int64_t j) const { return f32 ? f32[j] : static_cast<float>(b16[j]); }
  void update(const CompactRule& rule, int64_t j, float m, float v, bool decay) const {
    if (f32) {
      f32[j] = rule.param(f32[j], m, v, decay);
      return;
    }
    if (rounding == MasterRounding::Kahan) {  // AnyPrecisionAdamW's op order, each op rounded to bf16
      float p = static_cast<float>(b16[j]);
      if (rule.decoupled && decay) p = static_cast<float>(c10::BFloat16(p * rule.decay_factor));
      const float c = static_cast<float>(c10::BFloat16(static_cast<float>(comp[j]) + rule.update(m, v)));
      const c10::BFloat16 next(p + c);
      comp[j] = c10::BFloat16(c + static_cast<float>(c10::BFloat16(p - static_cast<float>(next))));
      b16[j] = next;
    } else if (rounding == MasterRounding::Stochastic) {
      b16[j] = round_stochastic(rule.param(static_cast<float>(b16[j]), m, v, decay),
                                stochastic_bits(seed, step, name, first + j));
    } else {
      b16[j] = c10::BFloat16(rule.param(static_cast<float>(b16[j]), m, v, decay));
    }
  }
};

CompactRule compact_rule(const AdamWOptions& o, double lr, int64_t step) {
  const double bias_correction1 = o.bias_correction ? 1.0 - std::pow(o.beta1, static_cast<double>(step)) : 1.0;
  const double bias_correction2 = o.bias_correction ? 1.0 - std::pow(o.beta2, static_cast<double>(step)) : 1.0;
  return CompactRule{static_cast<float>(o.beta1), static_cast<float>(1.0 - o.beta1),
                     static_cast<float>(o.beta2), static_cast<float>(1.0 - o.beta2),
                     static_cast<float>(o.eps), static_cast<float>(std::sqrt(bias_correction2)),
                     static_cast<float>(-lr / bias_correction1), static_cast<float>(1.0 - lr * o.weight_decay),
                     static_cast<float>(o.weight_decay), o.rule == UpdateRule::AdamW,
                     o.rule == UpdateRule::AdamL2 && o.weight_decay != 0};
}

// Where a piece lies: its first element in the parameter, and its slots of shared blocks.
struct PieceBlocks {
  int64_t offset;  // the piece's element 0 in the parameter
  int64_t n;       // elements
  int64_t first_slot, last_slot;
  // Elements [lo, hi) of the piece's local block k.
  std::pair<int64_t, int64_t> range(int64_t k) const {
    const int64_t start = (first_block(offset) + k) * kQuantBlock - offset;
    return {std::max<int64_t>(start, 0), std::min<int64_t>(start + kQuantBlock, n)};
  }
};

}  // namespace

namespace {
Masters masters_of(const AdamW::Piece& piece, const Segment& seg, const AdamWOptions& o, int64_t step, uint32_t name) {
  Masters m;
  if (o.masters == MasterRounding::None) {
    m.f32 = piece.param.data_ptr<float>();
    return m;
  }
  m.b16 = piece.param.data_ptr<c10::BFloat16>();
  if (piece.compensation.defined()) m.comp = piece.compensation.data_ptr<c10::BFloat16>();
  m.rounding = o.masters;
  m.seed = o.seed;
  m.step = step;
  m.name = name;
  m.first = (seg.stream_offset >= 0 ? seg.stream_offset : seg.param_offset) + piece.begin;
  return m;
}
}  // namespace

bool AdamW::shares_blocks(const Piece& p) const {
  const size_t i = p.segment;
  if (shared_count_ == 0 || format_[i] != StatePrecision::Int8) return false;
  return (p.begin == 0 && shared_slots_[i].first >= 0) ||
         (p.begin + p.numel == segments_[i].grad.numel() && shared_slots_[i].second >= 0);
}

void AdamW::collect_shared_maxima(const std::vector<Piece>& pieces, const std::vector<double>* grad_multipliers) {
  if (shared_count_ == 0) return;
  if (!shared_.defined()) shared_ = at::zeros({2 * shared_count_}, at::kFloat);
  // The rule's moment update needs no learning rate.
  const CompactRule rule = compact_rule(opt_, 0.0, step_);
  const Quantizer q1(true), q2(false);
  float* s = shared_.data_ptr<float>();
  for (const auto& piece : pieces) {
    if (!shares_blocks(piece)) continue;
    const size_t i = piece.segment;
    const auto& seg = segments_[i];
    const auto grad = seg.grad.view({-1}).narrow(0, piece.begin, piece.numel).to(at::kFloat).contiguous();
    const float* g = grad.data_ptr<float>();
    const Masters p = masters_of(piece, seg, opt_, step_, stream_name_[i]);
    const uint8_t* c1 = piece.exp_avg.data_ptr<uint8_t>();
    const uint8_t* c2 = piece.exp_avg_sq.data_ptr<uint8_t>();
    const float mult = grad_multipliers ? static_cast<float>((*grad_multipliers)[i]) : 1.0f;
    const bool scaled = grad_multipliers && (*grad_multipliers)[i] != 1.0;
    const int64_t last = piece.absmax1.numel() - 1;
    const PieceBlocks where{seg.param_offset + piece.begin, piece.numel, -1, -1};
    const int64_t first_slot = piece.begin == 0 ? shared_slots_[i].first : -1;
    const int64_t last_slot = piece.begin + piece.numel == seg.grad.numel() ? shared_slots_[i].second : -1;
    for (const auto& [slot, k] : {std::pair{first_slot, int64_t{0}}, std::pair{last_slot, last}}) {
      if (slot < 0) continue;
      const auto [lo, hi] = where.range(k);
      const float a1 = piece.absmax1.data_ptr<float>()[k], a2 = piece.absmax2.data_ptr<float>()[k];
      float max1 = 0, max2 = 0;
      for (int64_t j = lo; j < hi; ++j) {
        float m = q1.dequantize(c1[j], a1), v = q2.dequantize(c2[j], a2);
        rule.moments(rule.grad(g[j], mult, scaled, p.get(j), seg.decay), m, v);
        max1 = std::max(max1, std::fabs(m));
        max2 = std::max(max2, std::fabs(v));
      }
      s[2 * slot] = std::max(s[2 * slot], max1);
      s[2 * slot + 1] = std::max(s[2 * slot + 1], max2);
    }
  }
}

void AdamW::reduce_shared_maxima() {
  if (shared_count_ == 0) return;
  if (!shared_.defined()) shared_ = at::zeros({2 * shared_count_}, at::kFloat);
  reduce_max_(shared_);
}

void AdamW::step_compact(double lr, const std::vector<double>* grad_multipliers, const std::vector<Piece>& pieces) {
  const CompactRule rule = compact_rule(opt_, lr, step_);
  const Quantizer q1(true), q2(false);
  auto multiplier = [&](size_t i) { return grad_multipliers ? static_cast<float>((*grad_multipliers)[i]) : 1.0f; };
  auto scaled = [&](size_t i) { return grad_multipliers && (*grad_multipliers)[i] != 1.0; };
  float m_new[kQuantBlock], v_new[kQuantBlock];
  for (const auto& piece : pieces) {
    const size_t i = piece.segment;
    if (!elementwise(i)) continue;
    const auto& seg = segments_[i];
    const auto grad = seg.grad.view({-1}).narrow(0, piece.begin, piece.numel).to(at::kFloat).contiguous();
    const float* g = grad.data_ptr<float>();
    const Masters p = masters_of(piece, seg, opt_, step_, stream_name_[i]);
    const float mult = multiplier(i);
    const bool sc = scaled(i);
    if (format_[i] != StatePrecision::Int8) {  // bf16 moments, or fp32 moments over bf16 masters
      auto run = [&](auto* m, auto* v) {
        using T = std::remove_pointer_t<decltype(m)>;
        for (int64_t j = 0, n = piece.numel; j < n; ++j) {
          float mj = static_cast<float>(m[j]), vj = static_cast<float>(v[j]);
          rule.moments(rule.grad(g[j], mult, sc, p.get(j), seg.decay), mj, vj);
          p.update(rule, j, mj, vj, seg.decay);
          m[j] = T(mj);  // bf16: round to nearest even
          v[j] = T(vj);
        }
      };
      if (format_[i] == StatePrecision::BF16)
        run(piece.exp_avg.data_ptr<at::BFloat16>(), piece.exp_avg_sq.data_ptr<at::BFloat16>());
      else
        run(piece.exp_avg.data_ptr<float>(), piece.exp_avg_sq.data_ptr<float>());
      continue;
    }
    const bool whole_start = piece.begin == 0, whole_end = piece.begin + piece.numel == seg.grad.numel();
    const int64_t offset = seg.param_offset + piece.begin;
    if ((!whole_start && offset % kQuantBlock != 0) || (!whole_end && (offset + piece.numel) % kQuantBlock != 0))
      fail("internal: a piece of 8-bit segment ", seg.name, " is not cut on a quantization-block boundary");
    const PieceBlocks where{offset, piece.numel, whole_start ? shared_slots_[i].first : -1,
                            whole_end ? shared_slots_[i].second : -1};
    uint8_t* c1 = piece.exp_avg.data_ptr<uint8_t>();
    uint8_t* c2 = piece.exp_avg_sq.data_ptr<uint8_t>();
    float* a1 = piece.absmax1.data_ptr<float>();
    float* a2 = piece.absmax2.data_ptr<float>();
    const int64_t blocks = piece.absmax1.numel();
    for (int64_t k = 0; k < blocks; ++k) {
      const auto [lo, hi] = where.range(k);
      float max1 = 0, max2 = 0;
      for (int64_t j = lo; j < hi; ++j) {
        float m = q1.dequantize(c1[j], a1[k]), v = q2.dequantize(c2[j], a2[k]);
        rule.moments(rule.grad(g[j], mult, sc, p.get(j), seg.decay), m, v);
        p.update(rule, j, m, v, seg.decay);
        m_new[j - lo] = m;
        v_new[j - lo] = v;
        max1 = std::max(max1, std::fabs(m));
        max2 = std::max(max2, std::fabs(v));
      }
      const int64_t slot = k == 0 && where.first_slot >= 0            ? where.first_slot
                           : k == blocks - 1 && where.last_slot >= 0 ? where.last_slot
                                                                      : -1;
      if (slot >= 0) {
        max1 = shared_.data_ptr<float>()[2 * slot];
        max2 = shared_.data_ptr<float>()[2 * slot + 1];
      }
      a1[k] = max1;
      a2[k] = max2;
      for (int64_t j = lo; j < hi; ++j) {
        c1[j] = q1.quantize(m_new[j - lo], max1);
        c2[j] = q2.quantize(v_new[j - lo], max2);
      }
    }
  }
}

// DeepSpeed's FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu, pinned 0.19.8), segment by segment:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   update = m / (sqrt(v) + eps) + wd p        (eps_inside_sqrt: m / sqrt(v + eps))
//   coeff = ||p|| / ||update|| clamped to [min_coeff, max_coeff] (1 when either norm is 0)
//   p -= step_size * coeff * update,  step_size = lr sqrt(1 - b2^t) / (1 - b1^t)  (lr without bias_correction)
void AdamW::step_lamb(double lr, const std::vector<double>* grad_multipliers) {
  ++step_;
  double step_size = lr;
  if (opt_.bias_correction) {
    const double bias_correction1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(step_));
    const double bias_correction2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(step_));
    step_size = lr * std::sqrt(bias_correction2) / bias_correction1;
  }
  lamb_coeffs_.assign(segments_.size(), 1.0);
  for (size_t i = 0; i < segments_.size(); ++i) {
    auto& param = segments_[i].param;
    const auto& raw_grad = segments_[i].grad;
    auto grad = raw_grad.scalar_type() == param.scalar_type() ? raw_grad : raw_grad.to(param.scalar_type());
    if (grad_multipliers && (*grad_multipliers)[i] != 1.0) grad = grad * (*grad_multipliers)[i];
    auto& m = exp_avg_[i];
    auto& v = exp_avg_sq_[i];
    m.mul_(opt_.beta1).add_(grad, 1.0 - opt_.beta1);
    v.mul_(opt_.beta2).addcmul_(grad, grad, 1.0 - opt_.beta2);
    const auto denom = opt_.eps_inside_sqrt ? (v + opt_.eps).sqrt() : v.sqrt().add_(opt_.eps);
    auto update = m / denom;
    if (segments_[i].decay && opt_.weight_decay != 0) update.add_(param, opt_.weight_decay);
    const auto norms = at::stack({param.norm(2), update.norm(2)}).to(at::kCPU, at::kDouble);
    const double w = norms[0].item<double>(), u = norms[1].item<double>();
    double coeff = 1.0;
    if (w != 0 && u != 0) {
      coeff = w / u;
      if (coeff > opt_.max_coeff) coeff = opt_.max_coeff;
      if (coeff < opt_.min_coeff) coeff = opt_.min_coeff;
    }
    lamb_coeffs_[i] = coeff;
    param.add_(update, -step_size * coeff);
  }
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < segments_.size(); ++i) {
    out.emplace_back(segments_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(segments_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
    if (absmax1_[i].defined()) {
      out.emplace_back(segments_[i].name + ".exp_avg.absmax", absmax1_[i]);
      out.emplace_back(segments_[i].name + ".exp_avg_sq.absmax", absmax2_[i]);
    }
    if (compensation_[i].defined()) out.emplace_back(segments_[i].name + ".compensation", compensation_[i]);
  }
  return out;
}

void AdamW::load_state(const std::map<std::string, at::Tensor>& state, int64_t step) {
  for (size_t i = 0; i < segments_.size(); ++i) {
    for (auto* pair : {&exp_avg_, &exp_avg_sq_}) {
      const std::string key = segments_[i].name + (pair == &exp_avg_ ? ".exp_avg" : ".exp_avg_sq");
      auto it = state.find(key);
      if (it == state.end()) fail("optimizer state has no tensor ", key);
      if (it->second.sizes() != (*pair)[i].sizes())
        fail("optimizer state tensor ", key, " has shape ", it->second.sizes(), ", expected ", (*pair)[i].sizes());
      if (it->second.scalar_type() != (*pair)[i].scalar_type())
        fail("optimizer state tensor ", key, " is ", it->second.scalar_type(), ", this run keeps ",
             (*pair)[i].scalar_type(), " (optimizer.state_precision differs from the saved run's)");
      (*pair)[i].copy_(it->second);
    }
    if (absmax1_[i].defined()) {
      for (auto* pair : {&absmax1_, &absmax2_}) {
        const std::string key = segments_[i].name + (pair == &absmax1_ ? ".exp_avg.absmax" : ".exp_avg_sq.absmax");
        auto it = state.find(key);
        if (it == state.end()) fail("optimizer state has no tensor ", key);
        (*pair)[i].copy_(it->second.view({-1}));
      }
    }
    if (compensation_[i].defined()) {
      const std::string key = segments_[i].name + ".compensation";
      auto it = state.find(key);
      if (it == state.end())
        fail("optimizer state has no tensor ", key, " (Kahan summation's compensation): resume with the "
             "optimizer.master_rounding the state was saved with");
      compensation_[i].copy_(it->second.view(compensation_[i].sizes()));
    }
  }
  step_ = step;
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) {
    if (!exp_avg_[i].defined()) continue;  // offloaded (drop_state)
    b += 2 * exp_avg_[i].numel() * exp_avg_[i].element_size();
    if (absmax1_[i].defined()) b += 2 * absmax1_[i].numel() * absmax1_[i].element_size();
    if (compensation_[i].defined()) b += compensation_[i].numel() * compensation_[i].element_size();
  }
  return b;
}

double local_grad_sum_of_squares(const std::vector<at::Tensor>& grads, const std::vector<double>* weights) {
  if (grads.empty()) return 0.0;
  // Norms computed where the gradients live, read back in one transfer, summed in double here.
  std::vector<at::Tensor> norms;
  for (const auto& g : grads) norms.push_back(g.detach().norm(2));
  const auto host = at::stack(norms).to(at::kCPU, at::kDouble);
  const double* v = host.data_ptr<double>();
  double sum = 0.0;
  for (size_t i = 0; i < grads.size(); ++i) sum += v[i] * v[i] * (weights ? (*weights)[i] : 1.0);
  return sum;
}

void clip_grads(const std::vector<at::Tensor>& grads, double total_norm, double max_norm) {
  if (max_norm <= 0) return;
  // torch computes clip_coef in float32 from a float32 total norm; match that rounding.
  const float norm32 = static_cast<float>(total_norm);
  const float coef = static_cast<float>(max_norm) / (norm32 + 1e-6f);
  const float clamped = coef < 1.0f ? coef : 1.0f;
  at::NoGradGuard no_grad;
  for (const auto& g : grads) g.detach().mul_(clamped);
}

}  // namespace shardlm::optim
