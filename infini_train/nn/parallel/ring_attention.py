"""Ring attention: causal attention over a sequence split across a context-parallel group, as an autograd Function
(a communication pattern like the tensor-parallel mappings).

The sequence is cut into 2N chunks and rank r of the N holds chunks r and 2N-1-r (the load-balanced causal layout
of Megatron-LM and torchtitan: every rank gets the same share of the triangle). Its queries stay; the keys and
values travel around the ring, one hop per step, the next hop's transfer started before the step's compute so the
two overlap. At each step every (query chunk, key chunk) pair runs the blocked kernels (autograd/ops/flash_kernels.py):
in full below the diagonal, causally on it, not at all above it, and the partial results merge by their
log-sum-exp. Backward passes the keys and values around again (the next hop again overlapping the compute), their
gradients following each rank's contribution, until the gradients arrive back home; the queries' gradients stay
local.
"""
from __future__ import annotations

import math

import numpy as np

from ...autograd.ops import flash_kernels as kernels
from ...autograd.ops import low_precision as lp
from ...autograd.ops.attention_dropout import draw_seed
from ...autograd.function import Op, op_error

_KV_TAG, _GRAD_TAG = 71, 72


def chunks_of(rank, size):
    """The two chunk indices (of 2 x size) rank ``rank`` holds."""
    return rank, 2 * size - 1 - rank


class RingAttention(Op):
    """``dropout_heads`` (offset, total): the heads of q are heads offset.. of ``total`` (a head subset, as hybrid
    context parallelism gives the ring), for dropout's masks; None: all of them."""

    def __init__(self, group, scale=None, dropout_p=0.0, enable_gqa=False, dropout_heads=None):
        self.group, self.scale, self.dropout_p, self.enable_gqa = group, scale, dropout_p, enable_gqa
        self.dropout_heads = dropout_heads

    # ------------------------------------------------------------------------------------------- pieces
    def _kv(self, k, v, heads):
        """k, v widened and repeated to the queries' heads (grouped-query attention)."""
        xp = self.xp
        k, v = lp.widen(xp, k, v)
        if self.enable_gqa and k.shape[-3] != heads:
            k, v = (xp.repeat(a, heads // a.shape[-3], axis=-3) for a in (k, v))
        return k, v

    def _fold_heads(self, grad, heads):
        """A gradient over the queries' heads summed onto the shared key/value heads."""
        if grad.shape[-3] == heads:
            return grad
        return grad.reshape(grad.shape[:-3] + (heads, grad.shape[-3] // heads) + grad.shape[-2:]).sum(axis=-3)

    def _pairs(self, src):
        """(local query rows, local key rows, causal) of each chunk pair to compute with ``src``'s keys."""
        c = self.chunk
        for qi, qc in enumerate(chunks_of(self.group.rank, self.group.size)):
            for ki, kc in enumerate(chunks_of(src, self.group.size)):
                if kc <= qc:
                    yield slice(qi * c, (qi + 1) * c), slice(ki * c, (ki + 1) * c), kc == qc, qc, kc

    def _blocks(self, causal, qc, kc):
        c, whole = self.chunk, 2 * self.chunk * self.group.size
        dropout = None if self.seed is None else (self.seed, whole, whole, qc * c, kc * c, self.dropout_p)
        return kernels.Blocks(self.xp, self.device, c, c, self.used_scale, causal=causal, dropout=dropout,
                              heads=self.dropout_heads)

    def _exchange(self, arrays, tag):
        """Send ``arrays`` to the next rank and receive the previous rank's into fresh buffers; returns
        (works, buffers); a Work keeps what it sends until waited on. Sends and receives start together, so the ring
        cannot deadlock."""
        xp, group = self.xp, self.group
        nxt, prev = (group.rank + 1) % group.size, (group.rank - 1) % group.size
        sent = [xp.ascontiguousarray(a) for a in arrays]
        buffers = [xp.empty_like(a) for a in sent]
        ops = [("send", a, nxt, tag + 10 * i) for i, a in enumerate(sent)]
        ops += [("recv", b, prev, tag + 10 * i) for i, b in enumerate(buffers)]
        return group.batch_isend_irecv(ops), buffers

    # ------------------------------------------------------------------------------------------- forward
    def forward(self, q, k, v):
        xp, group = self.xp, self.group
        if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[-2] % 2 or q.shape[-2] != k.shape[-2]:
            raise op_error("ring_attention", "q, k, v of shape (B, heads, 2c, E) with this rank's two chunks",
                           f"q {q.shape}, k {k.shape}, v {v.shape}",
                           "split the sequence into 2 x context-parallel-size chunks (context_parallel.py)")
        self.in_dtype = q.dtype
        self.chunk = q.shape[-2] // 2
        self.used_scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.seed = draw_seed(self.device) if self.dropout_p > 0.0 else None
        heads = q.shape[-3]
        qw = lp.widen(xp, q)[0]
        out = xp.zeros(q.shape[:-1] + (v.shape[-1],), qw.dtype)
        lse = xp.full(q.shape[:-1] + (1,), np.inf, qw.dtype)  # +inf: no key seen yet
        held = (k, v)
        for step in range(group.size):
            src = (group.rank - step) % group.size
            works, incoming = self._exchange(held, _KV_TAG) if step < group.size - 1 else ([], None)
            kk, vv = self._kv(*held, heads)
            for rows, keys, causal, qc, kc in self._pairs(src):
                part_out, part_lse = kernels.forward(self._blocks(causal, qc, kc), qw[..., rows, :],
                                                     kk[..., keys, :], vv[..., keys, :])
                kernels.merge(out[..., rows, :], lse[..., rows, :], part_out, part_lse, xp)
            for work in works:
                work.wait()
            held = incoming
        self.stash(out, lse)
        return lp.narrow(xp, out, self.in_dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(*inputs)

    # ------------------------------------------------------------------------------------------ backward
    def backward(self, g):
        xp, group = self.xp, self.group
        q, k, v = self.saved_arrays
        out, lse = self.stashed
        heads, kv_heads = q.shape[-3], k.shape[-3]
        qw = lp.widen(xp, q)[0]
        g = g.astype(out.dtype, copy=False)
        d = (g * out).sum(axis=-1, keepdims=True)
        grad_q = xp.zeros(qw.shape, out.dtype)
        held = (k, v)
        held_grads = [xp.zeros(k.shape, out.dtype), xp.zeros(v.shape, out.dtype)]
        for step in range(group.size):
            src = (group.rank - step) % group.size
            last = step == group.size - 1  # the gradients go home; the keys and values are not needed any more
            kv_works, incoming_kv = self._exchange(held, _KV_TAG) if not last else ([], None)
            kk, vv = self._kv(*held, heads)
            grad_k, grad_v = xp.zeros(kk.shape, out.dtype), xp.zeros(vv.shape, out.dtype)
            for rows, keys, causal, qc, kc in self._pairs(src):
                kernels.backward(self._blocks(causal, qc, kc), qw[..., rows, :], kk[..., keys, :], vv[..., keys, :],
                                 g[..., rows, :], d[..., rows, :], lse[..., rows, :], grad_q[..., rows, :],
                                 grad_k[..., keys, :], grad_v[..., keys, :])
            held_grads[0] += self._fold_heads(grad_k, kv_heads)
            held_grads[1] += self._fold_heads(grad_v, kv_heads)
            # (the keys went on during the compute; a ring of one rank has its gradients home already)
            works, incoming = self._exchange(held_grads, _GRAD_TAG) if group.size > 1 else ([], held_grads)
            for work in kv_works + works:
                work.wait()
            held, held_grads = incoming_kv, incoming
        grad_q *= self.used_scale
        held_grads[0] *= self.used_scale
        return tuple(lp.narrow(xp, a, self.in_dtype) for a in (grad_q, held_grads[0], held_grads[1]))


def ring_attention(q, k, v, group, dropout_p=0.0, enable_gqa=False, scale=None, dropout_heads=None):
    """Causal attention of this rank's two chunks of q (B, heads, 2c, E) over the whole sequence, whose keys and
    values (this rank's chunks: k, v (B, kv_heads, 2c, E)) are spread over the context-parallel ``group``;
    ``dropout_heads`` as RingAttention's."""
    return RingAttention(group, scale, float(dropout_p), bool(enable_gqa), dropout_heads).apply(q, k, v)


__all__ = ["ring_attention", "RingAttention", "chunks_of"]
