"""Context parallelism: one sequence split over a context-parallel group. Each rank holds two of the sequence's
2N chunks, r and 2N-1-r (the load-balanced causal layout: ``local_chunks``), and inside ``context_parallel(group)``
a model's causal self-attention runs over the group (``context_attention``) and its positions (GPT-2's position
embeddings, LLaMA's rotary tables) are the global positions of the rank's tokens (``local_positions``). Everything
else in a transformer works token by token, so it runs unchanged on the local tokens; the loss of the local tokens
averaged over the group is the whole sequence's (equal shares).

The attention has three methods, all on the same token layout: ``ring`` (ring_attention.py: keys and values travel
around the group), ``ulysses`` (ulysses.py: all-to-all from the sequence split to a head split, whole-sequence
attention on H / N heads, and back) and ``hybrid`` (all-to-all inside groups of consecutive context ranks, ring
attention across them)."""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ... import backend
from ...autograd.recompute import register_forward_state
from ...tensor import Tensor
from .ring_attention import chunks_of, ring_attention
from .ulysses import ulysses_attention


METHODS = ("ring", "ulysses", "hybrid")


class ContextSplit:
    """How a forward's attention runs over the context group ``group``: ``method`` (METHODS), the all-to-all group
    (ulysses: the context group; hybrid: this rank's group of consecutive context ranks) and, for hybrid, the ring
    group (the ranks at this rank's place in every all-to-all group)."""

    def __init__(self, group, method="ring", a2a_group=None, ring_group=None):
        if method not in METHODS:
            raise ValueError(f"context_parallel: expected method one of {METHODS}, got {method!r}\nHINT: ring, "
                             "ulysses (all-to-all over the heads) or hybrid (all-to-all inside groups, ring across)")
        if method == "ulysses":
            a2a_group = a2a_group if a2a_group is not None else group
        if method == "hybrid" and (a2a_group is None or ring_group is None
                                   or a2a_group.size * ring_group.size != group.size):
            sizes = (f"{a2a_group.size if a2a_group is not None else None} x "
                     f"{ring_group.size if ring_group is not None else None}")
            raise ValueError(f"context_parallel: expected with method='hybrid' an a2a_group and a ring_group whose "
                             f"sizes multiply to the context group's {group.size}, got {sizes}\nHINT: make them with "
                             "ProcessMesh(context=N, context_a2a=A) (its context_a2a_group and context_ring_group)")
        self.group, self.method = group, method
        self.a2a_group = a2a_group if method != "ring" else None
        self.ring_group = ring_group if method == "hybrid" else None


class _State(threading.local):
    split = None


_state = _State()


@contextlib.contextmanager
def context_parallel(group, method="ring", a2a_group=None, ring_group=None):
    """Run the model's causal self-attention over ``group`` (the context-parallel ranks) inside the block, by
    ``method``: ring (ring attention), ulysses (all-to-all over the heads, over ``a2a_group``: default the whole
    group) or hybrid (all-to-all inside ``a2a_group``, ring attention over ``ring_group``)."""
    split = ContextSplit(group, method, a2a_group, ring_group) if group is not None and group.size > 1 else None
    previous, _state.split = _state.split, split
    try:
        yield
    finally:
        _state.split = previous


def active_group():
    """The context-parallel group a forward runs under, or None."""
    return _state.split.group if _state.split is not None else None


def active_split():
    """The ContextSplit a forward runs under, or None."""
    return _state.split


def _set_split(split):
    _state.split = split


register_forward_state(active_split, _set_split)  # a recomputed block runs its attention over the same groups


def context_attention(q, k, v, dropout_p=0.0, enable_gqa=False, sinks=None, window=None):
    """Causal attention of this rank's two chunks of q, k, v (B, heads, 2c, D) over the whole sequence, by the
    active split's method (call inside ``context_parallel``)."""
    split = _state.split
    if split.method == "ring":
        if sinks is not None or window is not None:
            raise NotImplementedError("parallel.context: ring attention with attention sinks or sliding windows is "
                                      "not supported\nHINT: use parallel.context_method=ulysses, or "
                                      "parallel.context=1 for this model")
        return ring_attention(q, k, v, split.group, dropout_p=dropout_p, enable_gqa=enable_gqa)
    return ulysses_attention(q, k, v, split.a2a_group, dropout_p=dropout_p, enable_gqa=enable_gqa, sinks=sinks,
                             window=window, ring_group=split.ring_group)


def local_chunks(x, group, dim=1):
    """This rank's two chunks (r and 2N-1-r of 2N) of the sequence dimension ``dim`` of ``x`` (a Tensor or array),
    concatenated."""
    n = group.size
    length = x.shape[dim]
    if length % (2 * n):
        raise ValueError(f"context parallel: a sequence of length {length} does not split into 2 x {n} equal chunks"
                         f"\nHINT: make train.sequence_length a multiple of {2 * n}")
    c = length // (2 * n)
    first, second = chunks_of(group.rank, n)
    index = [slice(None)] * x.ndim
    parts = []
    for chunk in (first, second):
        index[dim] = slice(chunk * c, (chunk + 1) * c)
        parts.append(x[tuple(index)])
    if isinstance(x, Tensor):
        from ...functional import cat
        return cat(parts, dim)
    return backend.device_of_array(x).array_module().concatenate(parts, axis=dim)


def local_positions(local_length, group):
    """The global positions (int64 numpy array) of the ``local_length`` tokens this rank holds."""
    c = local_length // 2
    first, second = chunks_of(group.rank, group.size)
    return np.concatenate([np.arange(first * c, (first + 1) * c), np.arange(second * c, (second + 1) * c)])


__all__ = ["context_parallel", "active_group", "active_split", "context_attention", "local_chunks", "local_positions",
           "ContextSplit", "METHODS"]
