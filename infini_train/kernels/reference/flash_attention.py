"""NumPy reference of the tensor-core attention kernels (flash_attention_source.py): the same tiles (64 query rows
and 64-key steps forward; 32-key steps for dq, 64 keys and 32-query steps for dk/dv), the same visited blocks, the
same float32 operations in the same order, products as common.products models them and the kernels' roundings of
P and dS to the input's dtype. What it cannot pin down: the additions inside one tensor-core instruction
(common.py), and expf / logf (CUDA's are within 2 ulps of the exact values, NumPy's float32 exp / log differ from
them by an ulp here and there). Rows of the kernels' 4-thread row groups: thread t of a row holds its columns
8j + 2t and 8j + 2t + 1, so the forward keeps 4 partial row sums, added in order j then column, and merged at the end
as (l0 + l1) + (l2 + l3).

q (B, H, Tq, D), k and v (B, Hkv, Tk, D) of one dtype (bfloat16 or float16), H a multiple of Hkv; causal is top-left
aligned (key j <= query i) and ``window`` > 0 keeps the keys j > i - window; dropout is attention_dropout.py's mask.
"""
from __future__ import annotations

import numpy as np

from ...autograd.ops.attention_dropout import keep_block
from ..flash_attention_source import BWD_STEP, FWD_KEYS, ROWS
from .common import F32, F64, butterfly_sum, padded, padded_rows, products, round_to

_NEG_INF, _POS_INF = F32(-np.inf), F32(np.inf)


def visible(queries, keys, tk, causal, window):
    """Whether each query sees each key (broadcast int arrays)."""
    seen = keys < tk
    if causal:
        seen = seen & (keys <= queries)
    if window > 0:
        seen = seen & (keys > queries - window)
    return seen


def key_range(q0, tk, causal, window, step):
    """The keys [begin, end) a block of query rows [q0, q0 + ROWS) visits, begin a multiple of ``step``."""
    end = q0 + ROWS if causal and q0 + ROWS < tk else tk
    begin = (q0 - window + 1) // step * step if window > 0 and q0 - window + 1 > 0 else 0
    return begin, end


def query_range(k0, tq, causal, window, step):
    """The queries [begin, end) that see a block of keys [k0, k0 + ROWS), begin a multiple of ``step``."""
    begin = k0 // step * step if causal else 0
    end = k0 + ROWS - 1 + window if window > 0 and k0 + ROWS - 1 + window < tq else tq
    return begin, end


def _dropout(seed, dropout_p):
    return (seed is not None and dropout_p > 0 and int(dropout_p * 2 ** 53) > 0), F32(1.0 / (1.0 - dropout_p))


def _repeat_heads(x, group):
    return np.repeat(x.astype(F64), group, axis=1) if group > 1 else x.astype(F64)


def forward(q, k, v, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    """(out in q's dtype (B, H, Tq, D), lse float32 (B, H, Tq), +inf where a row saw no key)."""
    dtype, (batch, heads, tq, dim), tk = q.dtype, q.shape, k.shape[2]
    group = heads // k.shape[1]
    qf, kf, vf = q.astype(F64), _repeat_heads(k, group), _repeat_heads(v, group)
    scale = F32(scale)
    dropout, rescale = _dropout(seed, dropout_p)
    out = np.zeros(q.shape, dtype)
    lse = np.empty((batch, heads, tq), F32)
    for q0 in range(0, tq, ROWS):
        queries = np.arange(q0, q0 + ROWS)[:, None]
        q_tile = padded_rows(qf, q0, ROWS)
        row_max = np.full((batch, heads, ROWS), _NEG_INF)
        quarter_sums = np.zeros((batch, heads, ROWS, 4), F32)
        acc = np.zeros((batch, heads, ROWS, dim), F32)
        begin, end = key_range(q0, tk, causal, window, FWD_KEYS)
        for k0 in range(begin, end, FWD_KEYS):
            keys = np.arange(k0, k0 + FWD_KEYS)[None, :]
            s = products(np.zeros((batch, heads, ROWS, FWD_KEYS), F32), q_tile,
                         padded_rows(kf, k0, FWD_KEYS).swapaxes(-1, -2))
            s = np.where(visible(queries, keys, tk, causal, window), s * scale, _NEG_INF)
            new_max = np.maximum(row_max, s.max(axis=-1))
            safe_max = np.where(new_max == _NEG_INF, F32(0), new_max)
            correction = np.exp(row_max - safe_max)
            row_max = new_max
            quarter_sums *= correction[..., None]
            p = np.exp(s - safe_max[..., None])
            for j in range(FWD_KEYS // 8):
                for e in range(2):
                    quarter_sums += p[..., 8 * j + 2 * np.arange(4) + e]
            if dropout:
                kept = keep_block(np, seed, (batch, heads), tq, tk, q0, q0 + ROWS, k0, k0 + FWD_KEYS, dropout_p)
                p = np.where(kept, p, F32(0))
            acc *= correction[..., None]
            acc = products(acc, round_to(p, dtype), padded_rows(vf, k0, FWD_KEYS))
        total = (quarter_sums[..., 0] + quarter_sums[..., 1]) + (quarter_sums[..., 2] + quarter_sums[..., 3])
        seen = total > 0
        inv = np.divide(F32(1), total, out=np.zeros_like(total), where=seen)
        o = acc * inv[..., None]
        if dropout:
            o *= rescale
        rows = min(ROWS, tq - q0)
        out[..., q0:q0 + rows, :] = o[..., :rows, :].astype(dtype)
        log_total = np.log(total, out=np.zeros_like(total), where=seen)
        lse[..., q0:q0 + rows] = np.where(seen, row_max + log_total, _POS_INF)[..., :rows]
    return out, lse


def row_dot(dout, out):
    """D = rowsum(dO * O) as attention_backward_dot sums it: lane c adds the columns c, c + 32, ... in order,
    then the warp's butterfly. float32 (B, H, Tq)."""
    terms = dout.astype(F32) * out.astype(F32)  # exact: products of two bfloat16/float16 values
    lanes = np.zeros(terms.shape[:-1] + (32,), F32)
    for c0 in range(0, terms.shape[-1], 32):
        lanes = lanes + padded(terms, c0, 32, F32(0))
    return butterfly_sum(lanes)


def backward(q, k, v, out, lse, dout, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    """(dq, dk, dv) in q's dtype, shaped as q, k, v."""
    dot = row_dot(dout, out)
    return (backward_dq(q, k, v, dout, lse, dot, scale, causal, window, seed, dropout_p),
            *backward_dkdv(q, k, v, dout, lse, dot, scale, causal, window, seed, dropout_p))


def backward_dq(q, k, v, dout, lse, dot, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    dtype, (batch, heads, tq, dim), tk = q.dtype, q.shape, k.shape[2]
    group = heads // k.shape[1]
    qf, gf, kf, vf = q.astype(F64), dout.astype(F64), _repeat_heads(k, group), _repeat_heads(v, group)
    scale = F32(scale)
    dropout, rescale = _dropout(seed, dropout_p)
    dq = np.zeros(q.shape, dtype)
    for q0 in range(0, tq, ROWS):
        queries = np.arange(q0, q0 + ROWS)[:, None]
        q_tile, g_tile = padded_rows(qf, q0, ROWS), padded_rows(gf, q0, ROWS)
        row_lse = padded(lse, q0, ROWS, _POS_INF)[..., None]
        row_dot_ = padded(dot, q0, ROWS, F32(0))[..., None]
        acc = np.zeros((batch, heads, ROWS, dim), F32)
        begin, end = key_range(q0, tk, causal, window, BWD_STEP)
        for k0 in range(begin, end, BWD_STEP):
            keys = np.arange(k0, k0 + BWD_STEP)[None, :]
            k_tile, v_tile = padded_rows(kf, k0, BWD_STEP), padded_rows(vf, k0, BWD_STEP)
            zeros = np.zeros((batch, heads, ROWS, BWD_STEP), F32)
            s = products(zeros, q_tile, k_tile.swapaxes(-1, -2))
            dp = products(zeros, g_tile, v_tile.swapaxes(-1, -2))
            with np.errstate(over="ignore"):
                p = np.where(visible(queries, keys, tk, causal, window), np.exp(s * scale - row_lse), F32(0))
            if dropout:
                kept = keep_block(np, seed, (batch, heads), tq, tk, q0, q0 + ROWS, k0, k0 + BWD_STEP, dropout_p)
                dp = np.where(kept, dp * rescale, F32(0))
            ds = p * (dp - row_dot_)
            acc = products(acc, round_to(ds, dtype), k_tile)
        rows = min(ROWS, tq - q0)
        dq[..., q0:q0 + rows, :] = (acc * scale)[..., :rows, :].astype(dtype)
    return dq


def backward_dkdv(q, k, v, dout, lse, dot, scale, causal=False, window=0, seed=None, dropout_p=0.0):
    dtype, (batch, heads, tq, dim), (kv_heads, tk) = q.dtype, q.shape, k.shape[1:3]
    group = heads // kv_heads
    qf, gf, kf, vf = q.astype(F64), dout.astype(F64), k.astype(F64), v.astype(F64)
    scale = F32(scale)
    dropout, rescale = _dropout(seed, dropout_p)
    dk, dv = np.zeros(k.shape, dtype), np.zeros(v.shape, dtype)
    for k0 in range(0, tk, ROWS):
        keys = np.arange(k0, k0 + ROWS)[:, None]
        k_tile, v_tile = padded_rows(kf, k0, ROWS), padded_rows(vf, k0, ROWS)
        acc_k = np.zeros((batch, kv_heads, ROWS, dim), F32)
        acc_v = np.zeros((batch, kv_heads, ROWS, dim), F32)
        begin, end = query_range(k0, tq, causal, window, BWD_STEP)
        for member in range(group):
            head = np.arange(kv_heads) * group + member
            for s0 in range(begin, end, BWD_STEP):
                queries = np.arange(s0, s0 + BWD_STEP)[None, :]
                q_step, g_step = padded_rows(qf[:, head], s0, BWD_STEP), padded_rows(gf[:, head], s0, BWD_STEP)
                step_lse = padded(lse[:, head], s0, BWD_STEP, _POS_INF)[..., None, :]
                step_dot = padded(dot[:, head], s0, BWD_STEP, F32(0))[..., None, :]
                zeros = np.zeros((batch, kv_heads, ROWS, BWD_STEP), F32)
                st = products(zeros, k_tile, q_step.swapaxes(-1, -2))
                dpt = products(zeros, v_tile, g_step.swapaxes(-1, -2))
                with np.errstate(over="ignore"):
                    p = np.where(visible(queries, keys, tk, causal, window), np.exp(st * scale - step_lse), F32(0))
                p_kept = p
                if dropout:
                    kept = keep_block(np, seed, (batch, heads), tq, tk, s0, s0 + BWD_STEP, k0, k0 + ROWS,
                                      dropout_p)[:, head].swapaxes(-1, -2)
                    dpt = np.where(kept, dpt * rescale, F32(0))
                    p_kept = np.where(kept, p, F32(0))
                ds = p * (dpt - step_dot)
                acc_v = products(acc_v, round_to(p_kept, dtype), g_step)
                acc_k = products(acc_k, round_to(ds, dtype), q_step)
        rows = min(ROWS, tk - k0)
        dk[..., k0:k0 + rows, :] = (acc_k * scale)[..., :rows, :].astype(dtype)
        dv[..., k0:k0 + rows, :] = ((acc_v * rescale) if dropout else acc_v)[..., :rows, :].astype(dtype)
    return dk, dv
