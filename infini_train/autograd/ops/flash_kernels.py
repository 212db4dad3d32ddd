"""The blocked attention kernels on xp arrays (FlashAttention-2), shared by the memory-efficient
scaled_dot_product_attention (flash_attention.py) and ring attention (nn/parallel/ring_attention.py), which runs
them on pairs of sequence chunks and merges the partial results by their log-sum-exp.

``forward`` gives the output and each row's log-sum-exp (+inf for a row that sees no key); ``backward`` recomputes
each block's probabilities from the final log-sum-exp and ``d = rowsum(dO * O)``. Arrays are widened (float32 at
least) and broadcast to one batch shape; ``dropout`` is (seed, whole Tq, whole Tk, first query, first key, p):
where these rows and keys sit in the whole attention, so the positional mask is the whole attention's.

A sliding ``window`` keeps query i to the keys j > i - window: key blocks wholly before a query block's window are
skipped, those across its edge get a block-sized mask (as causal blocks on the diagonal). Attention ``sinks`` (one
logit per head, broadcast as (heads, 1, 1)) start each row's online softmax: the running max at the sink and the
running sum at 1, a key with no value; the log-sum-exp then counts it, and backward's probabilities exclude it."""
from __future__ import annotations

import numpy as np

from . import low_precision as lp
from .attention_dropout import keep_block
from ..function import sum_to

BLOCK = 256  # query rows and keys per block: a (..., 256, 256) float32 score block per (batch, head) is 256 KB


class Blocks:
    """How one attention is cut into blocks: ``block`` rows and keys, causal (top-left aligned) or not, an optional
    mask broadcastable to (..., Tq, Tk) and dropout (``heads``: where the batch's heads sit among all of them, for
    the masks: attention_dropout.keep_block)."""

    def __init__(self, xp, device, tq, tk, scale, causal=False, mask=None, dropout=None, block=BLOCK, window=None,
                 heads=None):
        self.xp, self.device, self.tq, self.tk, self.scale = xp, device, tq, tk, scale
        self.causal, self.mask, self.dropout, self.block = causal, mask, dropout, block
        self.window, self.heads = window, heads

    def rows(self):
        return [(a, min(a + self.block, self.tq)) for a in range(0, self.tq, self.block)]

    def keys(self, q0, q1):
        """The key blocks query rows [q0, q1) attend to (causal: none wholly above the diagonal; a sliding window:
        none wholly before the first row's window)."""
        end = min(q1, self.tk) if self.causal else self.tk
        start = min(max(0, q0 - self.window + 1), end) if self.window is not None else 0
        return [(a, min(a + self.block, end)) for a in range(start, end, self.block)]

    def scores(self, q_scaled, k, q0, q1, k0, k1):
        """q_scaled k[k0:k1]^T plus the causal and given masks."""
        xp = self.xp
        s = lp.matmul(xp, q_scaled, xp.swapaxes(k[..., k0:k1, :], -1, -2))
        above = self.causal and k1 - 1 > q0  # the block reaches above the diagonal
        before = self.window is not None and q1 - 1 - k0 >= self.window  # or before some row's window
        if above or before:
            s += _band_bias(xp, self.device, q0 - k0, q1 - q0, k1 - k0, s.dtype, above, self.window if before
                            else None)
        if self.mask is not None:
            block = _mask_block(self.mask, q0, q1, k0, k1)
            if block.dtype == bool:
                block = xp.where(block, xp.asarray(0, s.dtype), xp.asarray(-np.inf, s.dtype))
            s += block
        return s

    def keep(self, batch, q0, q1, k0, k1):
        """The dropout mask of the block, scaled by 1 / (1 - p), or None."""
        if self.dropout is None:
            return None
        seed, whole_q, whole_k, first_q, first_k, p = self.dropout
        keep = keep_block(self.xp, seed, batch, whole_q, whole_k, first_q + q0, first_q + q1, first_k + k0,
                          first_k + k1, p, self.heads)
        return keep * (1.0 / (1.0 - p))


def forward(blocks, q, k, v, sinks=None):
    """(out, lse) of attention of q (..., Tq, E) over k, v (..., Tk, E / Ev), all of one batch shape; ``sinks``
    (heads, 1, 1) or None."""
    xp = blocks.xp
    batch, dtype = q.shape[:-2], q.dtype
    out = xp.zeros(batch + (blocks.tq, v.shape[-1]), dtype)
    lse = xp.empty(batch + (blocks.tq, 1), dtype)
    for q0, q1 in blocks.rows():
        q_scaled = q[..., q0:q1, :] * blocks.scale
        if sinks is None:
            run_max = xp.full(batch + (q1 - q0, 1), -np.inf, dtype)
            run_sum = xp.zeros(batch + (q1 - q0, 1), dtype)
        else:  # the sink: the first "key" of every row, exp(sink - max) = 1 with no value
            run_max = xp.broadcast_to(sinks.astype(dtype, copy=False), batch + (q1 - q0, 1)).copy()
            run_sum = xp.ones(batch + (q1 - q0, 1), dtype)
        acc = out[..., q0:q1, :]
        for k0, k1 in blocks.keys(q0, q1):
            p = blocks.scores(q_scaled, k, q0, q1, k0, k1)
            new_max = xp.maximum(run_max, p.max(axis=-1, keepdims=True))
            safe = xp.where(xp.isneginf(new_max), xp.asarray(0, dtype), new_max)  # a row masked so far
            p -= safe
            xp.exp(p, out=p)
            correction = xp.exp(run_max - safe)
            run_sum *= correction
            run_sum += p.sum(axis=-1, keepdims=True)
            keep = blocks.keep(batch, q0, q1, k0, k1)
            if keep is not None:
                p *= keep
            acc *= correction
            acc += lp.matmul(xp, p, v[..., k0:k1, :])
            run_max = new_max
        empty = run_sum == 0  # every key masked: zeros, as the materialised path's safe softmax
        run_sum[empty] = 1
        acc /= run_sum
        lse[..., q0:q1, :] = xp.where(empty, xp.asarray(np.inf, dtype), run_max + xp.log(run_sum))
    return out, lse


def backward(blocks, q, k, v, g, d, lse, grad_q, grad_k, grad_v, grad_mask=None):
    """Add the gradients of attention (with the final ``lse`` and ``d = rowsum(dO * O)``) into grad_q, grad_k,
    grad_v (unscaled: the caller multiplies grad_q and grad_k by the scale) and grad_mask (the mask's shape)."""
    xp = blocks.xp
    batch = q.shape[:-2]
    for q0, q1 in blocks.rows():
        q_rows = q[..., q0:q1, :]
        q_scaled = q_rows * blocks.scale
        g_rows, d_rows, lse_rows = g[..., q0:q1, :], d[..., q0:q1, :], lse[..., q0:q1, :]
        for k0, k1 in blocks.keys(q0, q1):
            p = blocks.scores(q_scaled, k, q0, q1, k0, k1)
            p -= lse_rows
            xp.exp(p, out=p)
            keep = blocks.keep(batch, q0, q1, k0, k1)
            grad_v[..., k0:k1, :] += lp.matmul(xp, xp.swapaxes(p if keep is None else p * keep, -1, -2), g_rows)
            ds = lp.matmul(xp, g_rows, xp.swapaxes(v[..., k0:k1, :], -1, -2))
            if keep is not None:
                ds *= keep
            ds -= d_rows
            ds *= p
            grad_q[..., q0:q1, :] += lp.matmul(xp, ds, k[..., k0:k1, :])
            grad_k[..., k0:k1, :] += lp.matmul(xp, xp.swapaxes(ds, -1, -2), q_rows)
            if grad_mask is not None:
                _add_mask_grad(grad_mask, ds, q0, q1, k0, k1)


def merge(out, lse, part_out, part_lse, xp):
    """Fold a partial result (over other keys) into (out, lse) in place: the softmax over the union of keys."""
    a, b = _finite_lse(lse, xp), _finite_lse(part_lse, xp)
    new = xp.logaddexp(a, b)
    safe = xp.where(xp.isneginf(new), xp.asarray(0, new.dtype), new)
    out *= xp.exp(a - safe)
    out += part_out * xp.exp(b - safe)
    lse[...] = xp.where(xp.isneginf(new), xp.asarray(np.inf, new.dtype), new)


def _finite_lse(lse, xp):
    """The kernels mark a row that saw no key with +inf; merging wants -inf (it adds nothing)."""
    return xp.where(xp.isposinf(lse), xp.asarray(-np.inf, lse.dtype), lse)


_band_cache = {}


def _band_bias(xp, device, offset, rows, cols, dtype, causal=True, window=None):
    """The mask of a (rows, cols) block whose first query is ``offset`` positions after its first key: -inf where
    key j > query i (``causal``) or j <= i - ``window``, else 0 (few distinct blocks recur, so they are cached)."""
    key = (offset, rows, cols, causal, window, np.dtype(dtype).str, device)
    bias = _band_cache.get(key)
    if bias is None:
        if len(_band_cache) > 64:
            _band_cache.clear()
        lag = xp.arange(rows).reshape(-1, 1) + offset - xp.arange(cols).reshape(1, -1)  # query i minus key j
        masked = lag < 0 if causal else xp.zeros((rows, cols), dtype=bool)
        if window is not None:
            masked |= lag >= window
        bias = _band_cache[key] = xp.where(masked, xp.asarray(-np.inf, dtype), xp.asarray(0, dtype))
    return bias


def _mask_block(mask, q0, q1, k0, k1):
    """The part of a broadcastable (..., Tq, Tk) mask over rows [q0, q1) and keys [k0, k1)."""
    rows = slice(q0, q1) if mask.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if mask.shape[-1] != 1 else slice(None)
    return mask[..., rows, cols]


def _add_mask_grad(grad_mask, ds, q0, q1, k0, k1):
    """Add the block ``ds`` of the scores' gradient to ``grad_mask`` (the mask's shape, broadcast dims summed)."""
    target = _mask_block(grad_mask, q0, q1, k0, k1)
    target += sum_to(ds, target.shape)


__all__ = ["Blocks", "forward", "backward", "merge", "BLOCK"]
