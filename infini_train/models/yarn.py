"""YaRN rotary scaling as transformers computes it (``_compute_yarn_parameters``): the inverse frequencies blended
between interpolation (positions / factor) and extrapolation over the beta_fast..beta_slow correction range, and
the attention factor the rotary embedding multiplies its cos and sin by; plus DeepSeek's mscale on the softmax
scale. The arithmetic is float32 where HF's is (its frequencies and ramp are float32 tensors), Python floats where
HF's is, so the tables are HF's bit for bit."""
from __future__ import annotations

import math

import numpy as np

# the keys of a yarn rope_scaling / rope_parameters dict this module reads (all but factor optional)
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate")


def get_mscale(scale, mscale=1.0):
    """YaRN's magnitude scale 0.1 * mscale * ln(scale) + 1 (1 when the context is not stretched)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_factor(params, max_position_embeddings=None):
    """The stretch factor: ``params["factor"]``, else max_position_embeddings / original_max_position_embeddings
    (HF's fallback for DeepSeek-style configs)."""
    factor = params.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("yarn: rope scaling without 'factor' needs max_position_embeddings to derive it")
        factor = max_position_embeddings / params["original_max_position_embeddings"]
    return factor


def attention_factor(params, max_position_embeddings=None):
    """The factor HF multiplies the rotary cos / sin by: ``attention_factor`` when given, else
    mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set (non-zero), else mscale(factor)."""
    given = params.get("attention_factor")
    if given is not None:
        return given
    factor = yarn_factor(params, max_position_embeddings)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def correction_range(beta_fast, beta_slow, dim, base, original_context, truncate=True):
    """The (low, high) rotary dimensions between which the frequencies ramp from extrapolated to interpolated."""
    def correction_dim(rotations):
        return (dim * math.log(original_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(dim, base, params, max_position_embeddings=None):
    """The (dim / 2,) float32 inverse frequencies of YaRN for a rotary width ``dim`` and theta ``base``."""
    factor = yarn_factor(params, max_position_embeddings)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1
    # the float32 exponents, raised in float64 and rounded once: torch's float32 pow is correctly rounded here, and
    # numpy's float32 pow is an ulp off for some exponents
    exponents = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    pos_freqs = (np.float64(np.float32(base)) ** exponents.astype(np.float64)).astype(np.float32)
    extrapolation = (np.float32(1.0) / pos_freqs).astype(np.float32)
    interpolation = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
    low, high = correction_range(beta_fast, beta_slow, dim, base, params["original_max_position_embeddings"],
                                 params.get("truncate", True))
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation_factor = (np.float32(1) - ramp).astype(np.float32)
    inv = interpolation * (np.float32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv.astype(np.float32)


def yarn_parameters(dim, base, params, max_position_embeddings=None):
    """(inv_freq, attention_factor): what HF's rotary embedding holds for rope_type 'yarn'."""
    return yarn_inv_freq(dim, base, params, max_position_embeddings), attention_factor(params,
                                                                                       max_position_embeddings)


def deepseek_softmax_scale(qk_head_dim, rope_scaling):
    """DeepSeek-V3's softmax scale: qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 when the rope is
    scaled and mscale_all_dim is set (HF's ``yarn_apply_mscale``)."""
    scale = qk_head_dim ** (-0.5)
    if rope_scaling:
        mscale_all_dim = rope_scaling.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = get_mscale(rope_scaling["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


__all__ = ["YARN_KEYS", "attention_factor", "correction_range", "deepseek_softmax_scale", "get_mscale",
           "yarn_factor", "yarn_inv_freq", "yarn_parameters"]
