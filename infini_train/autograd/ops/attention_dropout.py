"""Attention dropout whose mask is a function of each weight's position: element (b, i, j) of the (batch, Tq, Tk)
weights is kept iff a counter-based hash (splitmix64) of (seed, its flat index) lands at or above ``p``. The seed is
one draw from the device's seeded generator per attention call, so masks are reproducible from ``manual_seed`` and
recomputation replays them; because the mask depends on positions only, any blocking of the weights (query rows,
key blocks, the memory-efficient path, a context-parallel rank's share) draws exactly the same mask. An attention over
a subset of the heads (Ulysses context parallelism gives each rank H / N of them) names where its heads sit among all
of them (``heads``), so its masks are those of the same heads in the whole attention."""
from __future__ import annotations

import numpy as np

from ... import backend

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def draw_seed(device):
    """One 53-bit seed from the device's generator (the call's dropout stream)."""
    value = backend.generator_for(device).random(1, dtype=np.float64)
    value = backend.to_device_array(value, backend.CPU)
    return int(float(value[0]) * 2 ** 53)


def keep_block(xp, seed, batch_shape, tq, tk, q0, q1, k0, k1, p, heads=None):
    """The keep mask (bool, shape batch_shape + (q1 - q0, k1 - k0)) of rows [q0, q1) and keys [k0, k1) of
    (batch, Tq, Tk) attention weights dropped with probability ``p``. ``heads`` (offset, total): the last batch dim
    holds heads offset .. offset + n - 1 of ``total`` heads (None: all of them), and the mask is theirs in the
    attention over every head."""
    u64 = xp.uint64
    batch = _flat_batch(xp, tuple(batch_shape), heads).reshape(tuple(batch_shape) + (1, 1))
    rows = xp.arange(q0, q1, dtype=u64).reshape(-1, 1)
    cols = xp.arange(k0, k1, dtype=u64).reshape(1, -1)
    z = (batch * u64(tq) + rows) * u64(tk) + cols
    z += u64((seed * _GOLDEN) % 2 ** 64)
    z ^= z >> u64(30)
    z *= u64(_MIX1)
    z ^= z >> u64(27)
    z *= u64(_MIX2)
    z ^= z >> u64(31)
    return (z >> u64(11)) >= u64(int(p * 2 ** 53))  # the top 53 bits, uniform in [0, 2^53)


def _flat_batch(xp, batch_shape, heads):
    """The flat (batch x heads) index of every entry of ``batch_shape`` in the attention over every head."""
    u64 = xp.uint64
    if heads is None:
        return xp.arange(int(np.prod(batch_shape, dtype=np.int64)), dtype=u64)
    offset, total = heads
    outer = int(np.prod(batch_shape[:-1], dtype=np.int64))
    mine = xp.arange(offset, offset + batch_shape[-1], dtype=u64).reshape(1, -1)
    return xp.arange(outer, dtype=u64).reshape(-1, 1) * u64(total) + mine


__all__ = ["draw_seed", "keep_block"]
