"""Memory-efficient scaled_dot_product_attention (the FlashAttention-2 algorithm on xp arrays): queries and keys /
values in blocks, each query block's softmax kept as a running max and sum (online softmax), so no (Tq, Tk) matrix
ever exists; forward saves only the output and each row's log-sum-exp, and backward recomputes each block's
probabilities from them. Causal blocks wholly above the diagonal are skipped, those on it get a block-sized mask.

Forward, per query block i and key block j:  S = q_i k_j^T * scale + masks,  m' = max(m, rowmax S),
P = exp(S - m'),  l = l * exp(m - m') + rowsum P,  O_i = O_i * exp(m - m') + dropout(P) v_j;  finally O_i /= l and
LSE_i = m + log l. Backward: D = rowsum(dO * O); per block P = exp(S - LSE), dV_j += dropout(P)^T dO_i,
dS = P * (dropout'(dO_i v_j^T) - D_i), dQ_i += dS k_j * scale, dK_j += dS^T q_i * scale (dMask = dS).

Results equal the materialised path's (attention.py) to float32 rounding: the same checks, grouped-query heads,
masks (bool or additive, broadcast), a fully masked row giving zeros, float32 accumulation for float16/bfloat16,
and the same dropout mask (attention_dropout.py: a function of positions, not of blocks)."""
from __future__ import annotations

import math

import numpy as np

from . import low_precision as lp
from .attention import ScaledDotProductAttention
from .attention_dropout import draw_seed, keep_block
from .function import sum_to

BLOCK = 256  # query rows and keys per block: a (..., 256, 256) float32 score block per (batch, head) is 256 KB


class BlockedAttention(ScaledDotProductAttention):
    block = BLOCK

    def _prepare(self, q, k, v):
        xp = self.xp
        q, k, v = lp.widen(xp, q, k, v)
        k, v = self._repeat_heads(q.shape[-3] if q.ndim > 2 else 1, k, v)
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q, k, v = (xp.broadcast_to(a, batch + a.shape[-2:]) for a in (q, k, v))
        return q, k, v, batch

    def _spans(self, n):
        return [(a, min(a + self.block, n)) for a in range(0, n, self.block)]

    def _key_spans(self, q0, q1):
        """The key blocks query rows [q0, q1) attend to (causal: none wholly above the diagonal)."""
        end = min(q1, self.tk) if self.is_causal else self.tk
        return [(a, min(a + self.block, end)) for a in range(0, end, self.block)]

    def _scores(self, q_scaled, k, mask, q0, q1, k0, k1):
        """q_scaled[q0:q1] k[k0:k1]^T plus the causal and given masks, in float32 at least."""
        xp = self.xp
        s = xp.matmul(q_scaled, xp.swapaxes(k[..., k0:k1, :], -1, -2))
        if self.is_causal and k1 - 1 > q0:  # the block reaches above the diagonal
            s += _diagonal_bias(xp, self.device, q0 - k0, q1 - q0, k1 - k0, s.dtype)
        if mask is not None:
            block = _mask_block(mask, q0, q1, k0, k1)
            if block.dtype == bool:
                block = xp.where(block, xp.asarray(0, s.dtype), xp.asarray(-np.inf, s.dtype))
            s += block
        return s

    def _keep(self, batch, q0, q1, k0, k1):
        keep = keep_block(self.xp, self.seed, batch, self.tq, self.tk, q0, q1, k0, k1, self.dropout_p)
        return keep * (1.0 / (1.0 - self.dropout_p))

    def forward(self, q, k, v, mask=None):
        xp = self.xp
        self._check(q, k, v, mask)
        self.in_dtype = q.dtype
        q, k, v, batch = self._prepare(q, k, v)
        self.tq, self.tk = tq, _ = q.shape[-2], k.shape[-2]
        self.used_scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.seed = draw_seed(self.device) if self.dropout_p > 0.0 else None
        dtype = q.dtype
        out = xp.zeros(batch + (tq, v.shape[-1]), dtype)
        lse = xp.empty(batch + (tq, 1), dtype)
        for q0, q1 in self._spans(tq):
            q_scaled = q[..., q0:q1, :] * self.used_scale
            run_max = xp.full(batch + (q1 - q0, 1), -np.inf, dtype)
            run_sum = xp.zeros(batch + (q1 - q0, 1), dtype)
            acc = out[..., q0:q1, :]
            for k0, k1 in self._key_spans(q0, q1):
                p = self._scores(q_scaled, k, mask, q0, q1, k0, k1)
                new_max = xp.maximum(run_max, p.max(axis=-1, keepdims=True))
                safe = xp.where(xp.isneginf(new_max), xp.asarray(0, dtype), new_max)  # a row masked so far
                p -= safe
                xp.exp(p, out=p)
                correction = xp.exp(run_max - safe)
                run_sum *= correction
                run_sum += p.sum(axis=-1, keepdims=True)
                if self.dropout_p > 0.0:
                    p *= self._keep(batch, q0, q1, k0, k1)
                acc *= correction
                acc += xp.matmul(p, v[..., k0:k1, :])
                run_max = new_max
            empty = run_sum == 0  # every key masked: zeros, as the materialised path's safe softmax
            run_sum[empty] = 1
            acc /= run_sum
            lse[..., q0:q1, :] = xp.where(empty, xp.asarray(np.inf, dtype), run_max + xp.log(run_sum))
        self.stash(out, lse)
        return lp.narrow(xp, out, self.in_dtype)

    def backward(self, g):
        xp = self.xp
        saved = self.saved_arrays
        q, k, v, batch = self._prepare(*saved[:3])
        mask = saved[3] if len(saved) == 4 else None
        out, lse = self.stashed
        shapes = self._input_shapes
        need_mask = len(shapes) == 4 and self.needs_input_grad[3]
        g = g.astype(out.dtype, copy=False)
        d = (g * out).sum(axis=-1, keepdims=True)
        grad_q, grad_k, grad_v = (xp.zeros(batch + a.shape[-2:], out.dtype) for a in (q, k, v))
        grad_mask = xp.zeros(mask.shape, out.dtype) if need_mask else None
        for q0, q1 in self._spans(self.tq):
            q_rows = q[..., q0:q1, :]
            q_scaled = q_rows * self.used_scale
            g_rows, d_rows, lse_rows = g[..., q0:q1, :], d[..., q0:q1, :], lse[..., q0:q1, :]
            for k0, k1 in self._key_spans(q0, q1):
                p = self._scores(q_scaled, k, mask, q0, q1, k0, k1)
                p -= lse_rows
                xp.exp(p, out=p)
                keep = self._keep(batch, q0, q1, k0, k1) if self.dropout_p > 0.0 else None
                grad_v[..., k0:k1, :] += xp.matmul(xp.swapaxes(p if keep is None else p * keep, -1, -2), g_rows)
                ds = xp.matmul(g_rows, xp.swapaxes(v[..., k0:k1, :], -1, -2))
                if keep is not None:
                    ds *= keep
                ds -= d_rows
                ds *= p
                grad_q[..., q0:q1, :] += xp.matmul(ds, k[..., k0:k1, :])
                grad_k[..., k0:k1, :] += xp.matmul(xp.swapaxes(ds, -1, -2), q_rows)
                if need_mask:
                    _add_mask_grad(grad_mask, ds, q0, q1, k0, k1)
        grads = (self._finish(grad_q, self.used_scale, 0), self._finish(grad_k, self.used_scale, 1),
                 self._finish(grad_v, 1.0, 2))
        grads = tuple(gr if need else None for gr, need in zip(grads, self.needs_input_grad[:3]))
        if len(shapes) == 4:
            return grads + (lp.narrow(xp, grad_mask, saved[3].dtype) if need_mask else None,)
        return grads


_diagonal_cache = {}


def _diagonal_bias(xp, device, offset, rows, cols, dtype):
    """The causal mask of a (rows, cols) block whose first query is ``offset`` positions after its first key:
    -inf where key j > query i, else 0 (few distinct blocks recur, so they are cached)."""
    key = (offset, rows, cols, np.dtype(dtype).str, device)
    bias = _diagonal_cache.get(key)
    if bias is None:
        if len(_diagonal_cache) > 64:
            _diagonal_cache.clear()
        above = xp.arange(cols).reshape(1, -1) > xp.arange(rows).reshape(-1, 1) + offset
        bias = _diagonal_cache[key] = xp.where(above, xp.asarray(-np.inf, dtype), xp.asarray(0, dtype))
    return bias


def _mask_block(mask, q0, q1, k0, k1):
    """The part of a broadcastable (..., Tq, Tk) mask over rows [q0, q1) and keys [k0, k1)."""
    rows = slice(q0, q1) if mask.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if mask.shape[-1] != 1 else slice(None)
    return mask[..., rows, cols]


def _add_mask_grad(grad_mask, ds, q0, q1, k0, k1):
    """Add the block ``ds`` of the scores' gradient to ``grad_mask`` (the mask's shape, broadcast dims summed)."""
    rows = slice(q0, q1) if grad_mask.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if grad_mask.shape[-1] != 1 else slice(None)
    target = grad_mask[..., rows, cols]
    target += sum_to(ds, target.shape)


__all__ = ["BlockedAttention", "BLOCK"]
