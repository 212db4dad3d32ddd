"""Context parallelism: one sequence split over a context-parallel group. Each rank holds two of the sequence's
2N chunks, r and 2N-1-r (the load-balanced causal layout: ``local_chunks``), and inside ``context_parallel(group)``
a model's causal self-attention runs as ring attention over the group (ring_attention.py) and its positions (GPT-2's
position embeddings, LLaMA's rotary tables) are the global positions of the rank's tokens (``local_positions``).
Everything else in a transformer works token by token, so it runs unchanged on the local tokens; the loss of the
local tokens averaged over the group is the whole sequence's (equal shares)."""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ... import backend
from ...autograd.recompute import register_forward_state
from ...tensor import Tensor
from .ring_attention import chunks_of


class _State(threading.local):
    group = None


_state = _State()


@contextlib.contextmanager
def context_parallel(group):
    """Run the model's causal self-attention over ``group`` (the context-parallel ranks) inside the block."""
    previous, _state.group = _state.group, group if group is not None and group.size > 1 else None
    try:
        yield
    finally:
        _state.group = previous


def active_group():
    """The context-parallel group a forward runs under, or None."""
    return _state.group


def _set_group(group):
    _state.group = group


register_forward_state(active_group, _set_group)  # a recomputed block runs its attention over the same group


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


__all__ = ["context_parallel", "active_group", "local_chunks", "local_positions"]
