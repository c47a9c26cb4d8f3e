// See rope.h. Each function is transformers' rope init function of the same name, with its
// dtypes: the exponents arange(0, dim, 2) / dim, a Python-float base, then tensor arithmetic in
// float32 (here: `math`).
#include "model/rope.h"

#include <ATen/ATen.h>

#include <cmath>

#include "util/error.h"

namespace shardlm::model {
namespace {

constexpr double kPi = 3.14159265358979323846;

// arange(0, dim, 2) / dim in `math`.
at::Tensor exponents(int64_t dim, at::ScalarType math, at::Device device) {
  return at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(math) / static_cast<double>(dim);
}

// 1 / base ** (arange(0, dim, 2) / dim): the default frequencies.
at::Tensor base_inv_freq(double base, int64_t dim, at::ScalarType math, at::Device device) {
  return 1.0 / at::pow(base, exponents(dim, math, device));
}

// _compute_dynamic_ntk_parameters. Beyond max_position_embeddings transformers passes the length
// as a tensor, so the new base is itself a float32 tensor there.
at::Tensor dynamic_inv_freq(const LlamaConfig& c, int64_t T, at::ScalarType math, at::Device device) {
  const int64_t dim = c.head_dim();
  const double factor = *c.rope.factor, max_pos = static_cast<double>(c.max_position_embeddings);
  const double power = static_cast<double>(dim) / static_cast<double>(dim - 2);
  if (T <= c.max_position_embeddings) {  // the frequencies computed at initialisation (seq_len = max positions)
    const double base = c.rope.theta * std::pow(factor * max_pos / max_pos - (factor - 1), power);
    return base_inv_freq(base, dim, math, device);
  }
  const auto seq = at::scalar_tensor(static_cast<double>(T), at::TensorOptions().dtype(math).device(device));
  const auto base = c.rope.theta * at::pow(factor * seq / max_pos - (factor - 1), power);
  return 1.0 / at::pow(base, exponents(dim, math, device));
}

// _compute_yarn_parameters.
std::pair<at::Tensor, double> yarn(const RopeParameters& r, int64_t dim, at::ScalarType math, at::Device device) {
  const double base = r.theta, factor = *r.factor;
  const double original = static_cast<double>(*r.original_max_position_embeddings);
  auto get_mscale = [](double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; };
  double attention = 0;
  if (r.attention_factor) attention = *r.attention_factor;
  else if (r.mscale.value_or(0) != 0 && r.mscale_all_dim.value_or(0) != 0)
    attention = get_mscale(factor, *r.mscale) / get_mscale(factor, *r.mscale_all_dim);
  else attention = get_mscale(factor, 1.0);
  // transformers: `beta_fast or 32`, `beta_slow or 1` (a zero takes the default too).
  const double beta_fast = r.beta_fast.value_or(0) != 0 ? *r.beta_fast : 32;
  const double beta_slow = r.beta_slow.value_or(0) != 0 ? *r.beta_slow : 1;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2 * kPi))) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (r.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a singular ramp
  const auto pos_freqs = at::pow(base, exponents(dim, math, device));
  const auto extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (factor * pos_freqs);
  const auto ramp = ((at::arange(dim / 2, at::TensorOptions().dtype(at::kLong).device(device)).to(math) - low) /
                     (high - low)).clamp(0, 1);
  const auto extrapolation_factor = 1 - ramp;
  return {interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor, attention};
}

// _compute_longrope_parameters, with dynamic_rope_update's choice of the factor list.
std::pair<at::Tensor, double> longrope(const LlamaConfig& c, int64_t T, at::ScalarType math, at::Device device) {
  const auto& r = c.rope;
  const int64_t dim = c.head_dim();
  const double original = static_cast<double>(*r.original_max_position_embeddings);
  const double factor = r.factor ? *r.factor : static_cast<double>(c.max_position_embeddings) / original;
  double attention = 1.0;
  if (r.attention_factor) attention = *r.attention_factor;
  else if (factor > 1.0) attention = std::sqrt(1 + std::log(factor) / std::log(original));
  const auto& list = static_cast<double>(T) > original ? r.long_factor : r.short_factor;
  // transformers builds the list as a float32 tensor (float64 here for a float64 model).
  const auto ext = at::tensor(list, at::TensorOptions().dtype(at::kDouble)).to(math).to(device);
  return {1.0 / (ext * at::pow(r.theta, exponents(dim, math, device))), attention};
}

// _compute_llama3_parameters.
at::Tensor llama3(const RopeParameters& r, int64_t dim, at::ScalarType math, at::Device device) {
  const auto inv_freq = base_inv_freq(r.theta, dim, math, device);
  const double factor = *r.factor, low = *r.low_freq_factor, high = *r.high_freq_factor;
  const double old_context = static_cast<double>(*r.original_max_position_embeddings);
  const double low_wavelen = old_context / low, high_wavelen = old_context / high;
  const auto wavelen = 2 * kPi / inv_freq;
  auto scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
  const auto smooth = (old_context / wavelen - low) / (high - low);
  const auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  const auto medium = (wavelen < high_wavelen).logical_not().logical_and((wavelen > low_wavelen).logical_not());
  return at::where(medium, smoothed, scaled);
}

}  // namespace

std::pair<at::Tensor, double> rope_inv_freq(const LlamaConfig& c, int64_t T, at::ScalarType math, at::Device device) {
  const auto& r = c.rope;
  const int64_t dim = c.head_dim();
  if (r.type == "default") return {base_inv_freq(r.theta, dim, math, device), 1.0};
  if (r.type == "linear") return {base_inv_freq(r.theta, dim, math, device) / *r.factor, 1.0};
  if (r.type == "dynamic") return {dynamic_inv_freq(c, T, math, device), 1.0};
  if (r.type == "yarn") return yarn(r, dim, math, device);
  if (r.type == "longrope") return longrope(c, T, math, device);
  if (r.type == "llama3") return {llama3(r, dim, math, device), 1.0};
  fail("internal: rope type '", r.type, "' has no implementation");
}

std::pair<at::Tensor, at::Tensor> rope_tables(const LlamaConfig& c, int64_t T, at::ScalarType math, at::Device device) {
  // Computed where they are used: a copy from pageable host memory would make the host wait for
  // every kernel already queued on a GPU, once per forward.
  const auto [inv_freq, scaling] = rope_inv_freq(c, T, math, device);
  const auto positions = at::arange(T, at::TensorOptions().dtype(at::kLong).device(device)).to(math);
  const auto freqs = at::outer(positions, inv_freq);
  const auto emb = at::cat({freqs, freqs}, -1);
  if (scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * scaling, emb.sin() * scaling};
}

bool rope_extends_beyond_max_positions(const LlamaConfig& c) { return c.rope.type == "dynamic"; }

}  // namespace shardlm::model
