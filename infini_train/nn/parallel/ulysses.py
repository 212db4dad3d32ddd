"""Ulysses attention (DeepSpeed-Ulysses; Megatron-LM's ``--cp-comm-type a2a``): causal attention over a sequence split
across a context-parallel group by trading the sequence split for a head split.

Every rank holds its two chunks r and 2N-1-r of the sequence's 2N (the load-balanced layout every context method
shares: context_parallel.py) for all H heads. One all-to-all per tensor sends head group j (H / N heads) of the
rank's tokens to rank j, so each rank receives every rank's chunks of its own head group; put in chunk order they are
the whole sequence, and the ordinary causal ``scaled_dot_product_attention`` runs on H / N heads (the memory-efficient
path for long sequences; attention sinks, sliding windows and grouped-query heads as in one process). The opposite
all-to-all returns the output to the token split. Both exchanges are autograd Ops whose backward is the other
(Megatron's mappings: each communication pattern with its conjugate), so q, k and v get their gradients exactly.

Hybrid context parallelism (Megatron's ``a2a+p2p``) runs the all-to-all inside groups of A consecutive context ranks
and ring attention across the groups: after the inner exchange a rank of group g holds the chunks gA .. gA+A-1 and
2N-gA-A .. 2N-1-gA, which are chunks g and 2R-1-g of the sequence cut into 2R = 2N / A chunks: the ring's load-balanced
layout, so RingAttention runs unchanged over the ranks of the same place in every group.

Dropout draws the one-process masks: the attention is told which of the H heads it has (``dropout_heads``:
attention_dropout.py), and every rank of the group draws the same seed (the same default stream, as ring attention).
"""
from __future__ import annotations

from ...autograd.function import Op, op_error
from ...autograd.ops.attention import scaled_dot_product_attention
from .ring_attention import RingAttention

_NAME = "ulysses_attention"


def sequence_to_heads(xp, x, group):
    """(B, H, 2c, D) of this rank's two chunks -> (B, H / A, 2Ac, D): the chunks of every rank of ``group`` (size A)
    for head group ``group.rank``, in sequence order (rank j's first chunks ascending, then their second chunks
    descending)."""
    a = group.size
    b, heads, length, d = x.shape
    h, c = heads // a, length // 2
    send = xp.ascontiguousarray(xp.swapaxes(x.reshape(b, a, h, length, d), 0, 1))  # block j: head group j
    received = xp.empty_like(send)
    group.all_to_all_single(received, send)  # block j: rank j's tokens of this rank's head group
    halves = received.reshape(a, b, h, 2, c, d)
    chunks = xp.concatenate([halves[:, :, :, 0], halves[::-1, :, :, 1]], axis=0)  # (2A, B, h, c, D)
    return xp.ascontiguousarray(chunks.transpose(1, 2, 0, 3, 4)).reshape(b, h, 2 * a * c, d)


def heads_to_sequence(xp, y, group):
    """``sequence_to_heads``' inverse: (B, H / A, 2Ac, D) in sequence order -> (B, H, 2c, D) of this rank's chunks."""
    a = group.size
    b, h, length, d = y.shape
    c = length // (2 * a)
    chunks = y.reshape(b, h, 2 * a, c, d).transpose(2, 0, 1, 3, 4)  # (2A, B, h, c, D)
    send = xp.ascontiguousarray(xp.stack([chunks[:a], chunks[a:][::-1]], axis=3)).reshape(a, b, h, 2 * c, d)
    received = xp.empty_like(send)
    group.all_to_all_single(received, send)  # block j: head group j of this rank's tokens
    return xp.ascontiguousarray(xp.swapaxes(received, 0, 1)).reshape(b, a * h, 2 * c, d)


class SequenceToHeads(Op):
    """The token split to the head split (``sequence_to_heads``); backward the opposite exchange."""

    def __init__(self, group):
        self.group = group

    def forward(self, x):
        return sequence_to_heads(self.xp, x, self.group)

    def backward(self, g):
        return heads_to_sequence(self.xp, g, self.group)


class HeadsToSequence(Op):
    """The head split back to the token split (``heads_to_sequence``); backward the opposite exchange."""

    def __init__(self, group):
        self.group = group

    def forward(self, y):
        return heads_to_sequence(self.xp, y, self.group)

    def backward(self, g):
        return sequence_to_heads(self.xp, g, self.group)


def check_heads(q, k, v, size):
    """An OpError unless q, k, v are (B, heads, 2c, D) with query and key/value heads that ``size`` ranks share."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[-2] % 2 or k.shape[-2] != q.shape[-2] \
            or v.shape[-2] != q.shape[-2]:
        raise op_error(_NAME, "q, k, v of shape (B, heads, 2c, D) with this rank's two chunks",
                       f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}",
                       "split the sequence into 2 x context-parallel-size chunks (context_parallel.local_chunks)")
    for name, count in (("query heads", q.shape[1]), ("key/value heads", k.shape[1])):
        if count % size:
            raise op_error(_NAME, f"{name} divisible by the all-to-all group's {size} ranks (each attends with "
                           f"{name} / {size} of them)", f"{count} {name}",
                           "use ring attention (parallel.context_method=ring), or an all-to-all group size that "
                           f"divides {count} (parallel.context_a2a with context_method=hybrid)")


def ulysses_attention(q, k, v, group, dropout_p=0.0, enable_gqa=False, scale=None, sinks=None, window=None,
                      ring_group=None):
    """Causal attention of this rank's two chunks of q (B, H, 2c, D) over the sequence spread over ``group``, by
    all-to-all over the heads (k, v: (B, kv_heads, 2c, D)). ``sinks`` (H,) and a sliding ``window`` as
    scaled_dot_product_attention takes them. With ``ring_group`` (hybrid: the ranks at this rank's place in every
    all-to-all group) the attention of the group's chunks runs as ring attention across the groups."""
    size = group.size
    check_heads(q, k, v, size)
    heads = q.shape[1]
    local = heads // size
    offset = group.rank * local
    dropout_heads = (offset, heads) if dropout_p else None
    qh, kh, vh = (SequenceToHeads(group).apply(t) for t in (q, k, v))
    if ring_group is not None:
        if sinks is not None or window is not None:
            raise NotImplementedError("parallel.context_method=hybrid: ring attention across the all-to-all groups "
                                      "takes no attention sinks or sliding windows\nHINT: use "
                                      "parallel.context_method=ulysses for this model")
        out = RingAttention(ring_group, scale, float(dropout_p), bool(enable_gqa), dropout_heads).apply(qh, kh, vh)
    else:
        if sinks is not None:
            sinks = sinks[offset:offset + local]
        out = scaled_dot_product_attention(qh, kh, vh, dropout_p=dropout_p, is_causal=True, scale=scale,
                                           enable_gqa=enable_gqa, sinks=sinks, sliding_window=window,
                                           dropout_heads=dropout_heads)
    return HeadsToSequence(group).apply(out)


__all__ = ["ulysses_attention", "sequence_to_heads", "heads_to_sequence", "SequenceToHeads", "HeadsToSequence",
           "check_heads"]
