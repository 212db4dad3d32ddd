"""scaled_dot_product_attention as one fused Op: scores, masks, stable softmax, dropout and the weighted
sum in forward; the analytic gradient in backward. Only the probability matrix is kept for backward."""
from __future__ import annotations

import math

from .. import backend
from .function import Op, op_error, sum_to


class ScaledDotProductAttention(Op):
    def __init__(self, is_causal=False, scale=None, dropout_p=0.0):
        self.is_causal = is_causal
        self.scale = scale
        self.dropout_p = dropout_p

    def forward(self, q, k, v, mask=None):
        xp = self.xp
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
            raise op_error("scaled_dot_product_attention", "q (..., Tq, E), k (..., Tk, E), v (..., Tk, Ev)",
                           f"q {q.shape}, k {k.shape}, v {v.shape}")
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.used_scale = scale
        s = xp.matmul(q, xp.swapaxes(k, -1, -2))
        s *= scale
        tq, tk = s.shape[-2], s.shape[-1]
        if self.is_causal:
            upper = xp.triu(xp.ones((tq, tk), dtype=bool), k=1)
            s[..., upper] = -xp.inf
        if mask is not None:
            if mask.dtype == bool:
                s = xp.where(mask, s, xp.asarray(-xp.inf, dtype=s.dtype))
            else:
                s = s + mask
        s -= s.max(axis=-1, keepdims=True)
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        probs = s
        keep = None
        if self.dropout_p > 0.0:
            keep = (backend.generator_for(self.device).random(s.shape, dtype=xp.float32) >= self.dropout_p)
            keep = keep * xp.asarray(1.0 / (1.0 - self.dropout_p), dtype=s.dtype)
            probs = s * keep
        self.stash(s, keep)
        return xp.matmul(probs, v)

    def setup_context(self, inputs, output):
        self.save_for_backward(*inputs[:3])

    def backward(self, g):
        xp = self.xp
        q, k, v = self.saved_arrays
        p, keep = self.stashed
        need_q, need_k, need_v = self.needs_input_grad[:3]
        dropped = p * keep if keep is not None else p
        gv = sum_to(xp.matmul(xp.swapaxes(dropped, -1, -2), g), v.shape) if need_v else None
        gq = gk = None
        if need_q or need_k:
            dp = xp.matmul(g, xp.swapaxes(v, -1, -2))
            if keep is not None:
                dp *= keep
            # dS = P * (dP - rowsum(dP * P)), scaled for the q @ k^T * scale product
            ds = dp * p
            ds -= p * ds.sum(axis=-1, keepdims=True)
            ds *= self.used_scale
            if need_q:
                gq = sum_to(xp.matmul(ds, k), q.shape)
            if need_k:
                gk = sum_to(xp.matmul(xp.swapaxes(ds, -1, -2), q), k.shape)
        return (gq, gk, gv) + ((None,) if len(self.next_functions) == 4 else ())


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(q @ k^T * scale + mask) @ v. ``attn_mask``: bool (True = attend) or float (added to scores).
    ``is_causal`` masks keys after each query (top-left aligned, as torch). The mask gets no gradient."""
    if not 0.0 <= dropout_p < 1.0:
        raise op_error("scaled_dot_product_attention", "dropout_p in [0, 1)", dropout_p)
    fn = ScaledDotProductAttention(is_causal, scale, dropout_p)
    if attn_mask is None:
        return fn.apply(q, k, v)
    return fn.apply(q, k, v, attn_mask)


__all__ = ["scaled_dot_product_attention"]
