"""RoPE of hf_llama.py, the plain-torch transcription of transformers' Llama-family causal LMs:
modeling_rope_utils.py's init functions and the rotary module's forward, in float32 as
transformers computes them (float64 for the float64 reference).

RoPE (`rope_parameters` in 5.x configs; `rope_theta` + `rope_scaling` in 4.x ones,
read as transformers' `convert_rope_params_to_dict` + `standardize_rope_params`
do, see `standardize_rope_parameters`): rope_type default, linear, dynamic, yarn,
longrope, llama3, each computing inverse frequencies and an attention scaling
(cos and sin are multiplied by it) exactly as transformers' rope init functions
do, plus the per-forward re-choice of `dynamic_rope_update` (dynamic NTK:
recomputed for seq_len = max(position_ids) + 1 when that exceeds
max_position_embeddings; longrope: long_factor iff seq_len >
original_max_position_embeddings, else short_factor). What is NOT modelled: the
state transformers' DynamicNTK rotary module keeps across forwards (after a
forward of length T1 > max_position_embeddings it keeps T1's frequencies for every
later forward of length T2 with max_position_embeddings <= T2 <= T1, and only
resets when T2 < max_position_embeddings); hf_llama is always a fresh model's
forward, i.e. frequencies for T2 itself.
"""

import math

import torch


def rotary_inv_freq(head_dim, rope_theta, dtype=torch.float32):
    """LlamaRotaryEmbedding.compute_default_rope_parameters:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    (computed in float32 in HF; `dtype` only differs for the float64 reference)
    """
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (rope_theta ** exponent)


def _rope_exponents(dim, dtype):
    """torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim (in `dtype`)"""
    return torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim


def _yarn_get_mscale(scale, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_init(cfg, dtype=torch.float32, seq_len=None):
    """ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len) (or the default one):
    returns (inv_freq [D/2] in `dtype`, attention_scaling: Python float).

    Scalars (base, factor, attention factor, YaRN correction range, llama3
    wavelength bands) are Python doubles as in HF; tensors are float32 in HF and
    `dtype` here (float64 for the float64 reference). The expressions are HF's,
    operand for operand, so float32 results are bitwise HF's.
    """
    rp = cfg.rope_parameters
    rope_type = cfg.rope_type
    base = rp["rope_theta"]
    dim = cfg.rope_dim

    if rope_type == "default":
        return rotary_inv_freq(dim, base, dtype), 1.0

    if rope_type == "linear":
        # _compute_linear_scaling_rope_parameters: frequencies divided by factor
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        inv_freq /= rp["factor"]
        return inv_freq, 1.0

    if rope_type == "dynamic":
        # _compute_dynamic_ntk_parameters. seq_len None (model init): max_position_embeddings
        # (Python) -> base unchanged when factor * max / max - (factor - 1) == 1. In a forward
        # HF passes seq_len = torch.max(position_ids) + 1, an int64 TENSOR: then `base` becomes a
        # 0-dim float32 tensor (the default dtype) and the NTK base is computed in float32.
        factor = rp["factor"]
        max_pos = cfg.max_position_embeddings
        if seq_len is None:
            seq_len = max_pos
        elif isinstance(seq_len, torch.Tensor):
            seq_len = torch.maximum(seq_len, torch.tensor(max_pos, dtype=seq_len.dtype, device=seq_len.device))
        else:
            seq_len = max(seq_len, max_pos)
        base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        return inv_freq, 1.0

    if rope_type == "yarn":
        # _compute_yarn_parameters
        factor = rp["factor"]
        attention_factor = rp.get("attention_factor")
        mscale = rp.get("mscale")
        mscale_all_dim = rp.get("mscale_all_dim")
        omp = rp["original_max_position_embeddings"]
        if factor is None:
            factor = cfg.max_position_embeddings / omp
        if attention_factor is None:
            if mscale and mscale_all_dim:  # truthiness: 0 / None -> the default formula
                attention_factor = float(_yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor, mscale_all_dim))
            else:
                attention_factor = _yarn_get_mscale(factor)
        beta_fast = rp.get("beta_fast") or 32
        beta_slow = rp.get("beta_slow") or 1

        def find_correction_dim(num_rotations):
            return (dim * math.log(omp / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        truncate = rp.get("truncate", True)  # truthiness: an explicit null means "do not truncate"
        low = find_correction_dim(beta_fast)
        high = find_correction_dim(beta_slow)
        if truncate:
            low = math.floor(low)
            high = math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # Prevent singularity
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)

        pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=dtype) / dim)
        inv_freq_extrapolation = 1.0 / pos_freqs
        inv_freq_interpolation = 1.0 / (factor * pos_freqs)
        inv_freq_extrapolation_factor = 1 - ramp
        inv_freq = (
            inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
            + inv_freq_extrapolation * inv_freq_extrapolation_factor
        )
        return inv_freq, attention_factor

    if rope_type == "longrope":
        # _compute_longrope_parameters
        long_factor = rp["long_factor"]
        short_factor = rp["short_factor"]
        factor = rp.get("factor")
        attention_factor = rp.get("attention_factor")
        omp = rp["original_max_position_embeddings"]
        if factor is None:
            factor = cfg.max_position_embeddings / omp
        if attention_factor is None:
            if factor <= 1.0:
                attention_factor = 1.0
            else:
                attention_factor = math.sqrt(1 + math.log(factor) / math.log(omp))
        if seq_len and seq_len > omp:
            ext_factors = torch.tensor(long_factor, dtype=dtype)
        else:
            ext_factors = torch.tensor(short_factor, dtype=dtype)
        inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim
        inv_freq = 1.0 / (ext_factors * base ** inv_freq_shape)
        return inv_freq, attention_factor

    if rope_type == "llama3":
        # _compute_llama3_parameters
        inv_freq = 1.0 / (base ** _rope_exponents(dim, dtype))
        factor = rp["factor"]
        low_freq_factor = rp["low_freq_factor"]
        high_freq_factor = rp["high_freq_factor"]
        old_context_len = rp["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # wavelen < high_freq_wavelen: do nothing; wavelen > low_freq_wavelen: divide by factor
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        # otherwise: interpolate between the two, using a smooth factor
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
        return inv_freq_llama, 1.0

    raise NotImplementedError(rope_type)


def llama3_bands(cfg, dtype=torch.float32):
    """For rope_type llama3: per frequency 'high' (kept), 'medium' (smoothed) or 'low'
    (divided by factor), with HF's comparisons (wavelen = 2*pi / inv_freq in `dtype`)."""
    rp = cfg.rope_parameters
    inv_freq = 1.0 / (rp["rope_theta"] ** _rope_exponents(cfg.rope_dim, dtype))
    wavelen = 2 * math.pi / inv_freq
    low = rp["original_max_position_embeddings"] / rp["low_freq_factor"]
    high = rp["original_max_position_embeddings"] / rp["high_freq_factor"]
    is_high, is_low = (wavelen < high).tolist(), (wavelen > low).tolist()
    return ["low" if lo else "high" if hi else "medium" for hi, lo in zip(is_high, is_low)]


def rope_for_forward(cfg, position_ids, dtype=torch.float32):
    """(inv_freq, attention_scaling) that transformers' rotary module uses in the forward of
    a freshly built model with these position_ids (`dynamic_rope_update`):

      seq_len = torch.max(position_ids) + 1
      dynamic:  seq_len > max_position_embeddings (= max_seq_len_cached of a fresh model)
                -> rope_init(seq_len=seq_len), seq_len an int64 tensor (float32 NTK base;
                a Python int in float64 mode so that it stays in double); else the init values
      longrope: long_factor frequencies iff seq_len > original_max_position_embeddings, else
                short_factor; attention_scaling is always the init one (it does not depend on
                seq_len)
      others:   the init values
    """
    rope_type = cfg.rope_type
    if rope_type == "dynamic":
        seq_len = torch.max(position_ids) + 1
        if seq_len > cfg.max_position_embeddings:
            return rope_init(cfg, dtype, seq_len=int(seq_len) if dtype == torch.float64 else seq_len)
        return rope_init(cfg, dtype)
    if rope_type == "longrope":
        seq_len = int(torch.max(position_ids)) + 1
        omp = cfg.rope_parameters["original_max_position_embeddings"]
        inv_freq, attention_scaling = rope_init(cfg, dtype)
        if seq_len > omp:
            inv_freq, _ = rope_init(cfg, dtype, seq_len=omp + 1)
        return inv_freq, attention_scaling
    return rope_init(cfg, dtype)


def rotary_cos_sin(inv_freq, position_ids, out_dtype, attention_scaling=1.0):
    """LlamaRotaryEmbedding.forward.

        freqs = position_ids[..., None].float() * self.inv_freq.float()   # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)                           # [B, T, D]
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)

    The angle for position p and frequency j is the float32 product p * inv_freq[j]
    (one rounded multiply). Both halves of the head dimension share the same
    frequencies ("cat", not "interleave"). The attention scaling (1.0 except for
    yarn and longrope) multiplies cos and sin in float32, before the cast.
    """
    acc = inv_freq.dtype
    freqs = position_ids[..., None].to(acc) * inv_freq.to(acc)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(out_dtype), sin.to(out_dtype)
