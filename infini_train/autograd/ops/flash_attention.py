"""Memory-efficient scaled_dot_product_attention (the FlashAttention-2 algorithm on xp arrays): queries and keys /
values in blocks, each query block's softmax kept as a running max and sum (online softmax), so no (Tq, Tk) matrix
ever exists; forward saves only the output and each row's log-sum-exp, and backward recomputes each block's
probabilities from them. Causal blocks wholly above the diagonal are skipped, those on it get a block-sized mask.
The kernels are flash_kernels.py's.

Forward, per query block i and key block j:  S = q_i k_j^T * scale + masks,  m' = max(m, rowmax S),
P = exp(S - m'),  l = l * exp(m - m') + rowsum P,  O_i = O_i * exp(m - m') + dropout(P) v_j;  finally O_i /= l and
LSE_i = m + log l. Backward: D = rowsum(dO * O); per block P = exp(S - LSE), dV_j += dropout(P)^T dO_i,
dS = P * (dropout'(dO_i v_j^T) - D_i), dQ_i += dS k_j * scale, dK_j += dS^T q_i * scale (dMask = dS).
Attention sinks start each row's running max and sum (flash_kernels.py), so LSE counts them; their gradient is
dSink_h = -sum over the head's rows of exp(sink_h - LSE) * D. Sliding windows skip the key blocks before them.

Results equal the materialised path's (attention.py) to float32 rounding: the same checks, grouped-query heads,
masks (bool or additive, broadcast), a fully masked row giving zeros, float32 accumulation for float16/bfloat16,
and the same dropout mask (attention_dropout.py: a function of positions, not of blocks)."""
from __future__ import annotations

import math

import numpy as np

from . import flash_kernels as kernels
from . import low_precision as lp
from .attention import ScaledDotProductAttention, sink_rows
from .attention_dropout import draw_seed

BLOCK = kernels.BLOCK


class BlockedAttention(ScaledDotProductAttention):
    block = BLOCK

    def _prepare(self, q, k, v):
        xp = self.xp
        q, k, v = lp.widen(xp, q, k, v)
        k, v = self._repeat_heads(q.shape[-3] if q.ndim > 2 else 1, k, v)
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        q, k, v = (xp.broadcast_to(a, batch + a.shape[-2:]) for a in (q, k, v))
        return q, k, v, batch

    def _blocks(self, mask):
        dropout = None if self.seed is None else (self.seed, self.tq, self.tk, 0, 0, self.dropout_p)
        return kernels.Blocks(self.xp, self.device, self.tq, self.tk, self.used_scale, self.is_causal, mask, dropout,
                              self.block, self.window, self.dropout_heads)

    def forward(self, q, k, v, *rest):
        mask, sinks = self._extras(rest)
        self._check(q, k, v, mask)
        self._check_sinks(q, sinks)
        self.in_dtype = q.dtype
        q, k, v, _ = self._prepare(q, k, v)
        self.tq, self.tk = q.shape[-2], k.shape[-2]
        self.used_scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.seed = draw_seed(self.device) if self.dropout_p > 0.0 else None
        column = None if sinks is None else sink_rows(sinks, q.dtype)
        out, lse = kernels.forward(self._blocks(mask), q, k, v, column)
        self.stash(out, lse)
        return lp.narrow(self.xp, out, self.in_dtype)

    def backward(self, g):
        xp = self.xp
        saved = self.saved_arrays
        q, k, v, batch = self._prepare(*saved[:3])
        mask, sinks = self._extras(saved[3:])
        out, lse = self.stashed
        need_mask = self.has_mask and self.needs_input_grad[3]
        g = g.astype(out.dtype, copy=False)
        d = (g * out).sum(axis=-1, keepdims=True)
        grad_q, grad_k, grad_v = (xp.zeros(batch + a.shape[-2:], out.dtype) for a in (q, k, v))
        grad_mask = xp.zeros(mask.shape, out.dtype) if need_mask else None
        kernels.backward(self._blocks(mask), q, k, v, g, d, lse, grad_q, grad_k, grad_v, grad_mask)
        grads = (self._finish(grad_q, self.used_scale, 0), self._finish(grad_k, self.used_scale, 1),
                 self._finish(grad_v, 1.0, 2))
        grads = tuple(gr if need else None for gr, need in zip(grads, self.needs_input_grad[:3]))
        grad_sinks = None
        if self.has_sinks and self.needs_input_grad[-1]:  # -exp(sink - LSE) * D over every row of the head
            part = xp.exp(sink_rows(sinks, out.dtype) - lse) * d
            grad_sinks = lp.narrow(xp, -part.reshape(-1, sinks.shape[0], part.shape[-2]).sum(axis=(0, 2)),
                                   sinks.dtype)
        return self._with_extras(grads, lp.narrow(xp, grad_mask, mask.dtype) if need_mask else None, grad_sinks)


__all__ = ["BlockedAttention", "BLOCK"]
