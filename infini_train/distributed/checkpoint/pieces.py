"""Where a rank's tensors sit in the global tensors: each local tensor is a list of pieces, a piece being a box of
the global tensor (offsets and sizes per dim) and the local array view that holds exactly that box.

Every way a rank keeps part of a tensor is a list of such boxes: a replicated tensor is one box (the whole); a
tensor-parallel shard is one box per block along the split dim (GPT-2's fused q, k, v rows are three); a flat range
of a flattened parameter (ZeRO's pieces) is at most a few boxes per dim (``flat_range_boxes``). Saving writes each
box; loading fills each box from whichever saved boxes overlap it, so a checkpoint written under one layout loads
under any other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LocalPieces:
    """This rank's part of a global tensor of ``global_shape`` and ``dtype``: ``pieces`` is a list of
    (global offsets, view), each view an array (numpy or cupy) of the box's sizes, written through on load."""

    global_shape: tuple
    dtype: object
    pieces: list = field(default_factory=list)

    def __post_init__(self):
        self.global_shape = tuple(int(n) for n in self.global_shape)
        for offsets, view in self.pieces:
            box_check(self.global_shape, offsets, view.shape)

    @classmethod
    def whole(cls, array):
        """A tensor this rank holds whole (replicated, or one process)."""
        return cls(tuple(array.shape), array.dtype, [((0,) * array.ndim, array)])

    @classmethod
    def flat_range(cls, global_shape, start, flat_view):
        """The elements [start, start + flat_view.size) of the flattened global tensor, held as the 1-D
        ``flat_view`` (a ZeRO piece)."""
        pieces, at = [], 0
        for offsets, sizes in flat_range_boxes(global_shape, start, start + flat_view.size):
            n = int(np.prod(sizes, dtype=np.int64))
            pieces.append((offsets, flat_view[at:at + n].reshape(sizes)))
            at += n
        return cls(global_shape, flat_view.dtype, pieces)

    def boxes(self):
        return [(tuple(int(o) for o in offsets), tuple(int(n) for n in view.shape)) for offsets, view in self.pieces]


def box_check(global_shape, offsets, sizes):
    if len(offsets) != len(global_shape) or len(sizes) != len(global_shape) or any(
            o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, global_shape)):
        raise ValueError(f"checkpoint pieces: the box at offsets {tuple(offsets)} of sizes {tuple(sizes)} does not lie "
                         f"in a tensor of shape {tuple(global_shape)}")


def flat_range_boxes(shape, start, stop):
    """The boxes (offsets, sizes) covering elements [start, stop) of a C-ordered tensor of ``shape``, in order:
    at most two partial rows around a block of whole rows, recursively."""
    shape = tuple(int(n) for n in shape)
    if start >= stop:
        return []
    if not shape:
        return [((), ())]
    inner = int(np.prod(shape[1:], dtype=np.int64))
    rest = (0,) * (len(shape) - 1)
    first, last = start // inner, (stop - 1) // inner
    if first == last:
        return [((first,) + o, (1,) + s) for o, s in flat_range_boxes(shape[1:], start - first * inner,
                                                                      stop - first * inner)]
    boxes = []
    if start % inner:
        boxes += [((first,) + o, (1,) + s) for o, s in flat_range_boxes(shape[1:], start % inner, inner)]
        first += 1
    whole_rows_end = stop // inner
    if whole_rows_end > first:
        boxes.append(((first,) + rest, (whole_rows_end - first,) + shape[1:]))
    if stop % inner:
        boxes += [((whole_rows_end,) + o, (1,) + s) for o, s in flat_range_boxes(shape[1:], 0, stop % inner)]
    return boxes


def overlap(a_offsets, a_sizes, b_offsets, b_sizes):
    """The intersection of two boxes as (offsets, sizes), or None when they do not meet."""
    lo = tuple(max(a, b) for a, b in zip(a_offsets, b_offsets))
    hi = tuple(min(a + n, b + m) for a, n, b, m in zip(a_offsets, a_sizes, b_offsets, b_sizes))
    if any(h <= low for low, h in zip(lo, hi)):
        return None
    return lo, tuple(h - low for low, h in zip(lo, hi))


def region(offsets, sizes, origin):
    """Slices selecting the box (offsets, sizes) inside an array whose element 0 sits at ``origin``."""
    return tuple(slice(o - base, o - base + n) for o, n, base in zip(offsets, sizes, origin))


__all__ = ["LocalPieces", "flat_range_boxes", "overlap", "region", "box_check"]
