"""Summing the gradients that several consumers send to one output of a node, before the node runs.

A later gradient is added into the one collected so far in place when the engine alone holds that array (it owns
its memory, nothing else refers to it, same shape and dtype): the same bits as ``prev + new``, without a new array
(GPT-2's residual stream, a tied weight's two gradients).

An embedding's weight gradient arrives as ``RowUpdates``: the summed rows of the ids it looked up, not a (V, C)
array of zeros. Added to another gradient of the same weight (GPT-2's lm_head shares the token embedding) it
touches only those rows; a node whose gradient is still ``RowUpdates`` when every edge has arrived gets it dense
(``Function._collect``), so backward functions, hooks, observers and captures only ever see arrays.
"""
from __future__ import annotations

import sys

from ..backend import is_device_array, is_writeable


class RowUpdates:
    """A (V, C) gradient that is zero except at rows ``ids`` (distinct), which hold ``rows``."""

    __slots__ = ("xp", "shape", "dtype", "ids", "rows")

    def __init__(self, xp, shape, ids, rows):
        self.xp, self.shape, self.dtype, self.ids, self.rows = xp, tuple(shape), rows.dtype, ids, rows

    def add_to(self, table):
        """table[ids] += rows, in place; returns ``table``."""
        table[self.ids] += self.rows
        return table

    def dense(self):
        return self.add_to(self.xp.zeros(self.shape, self.dtype))


def dense(grad):
    """``grad`` as an array (a RowUpdates made dense)."""
    return grad.dense() if type(grad) is RowUpdates else grad


def _in_place_ok(array, unshared):
    if not unshared or not is_writeable(array):
        return False
    base = array.base
    if base is None:
        return True
    # a reshaped array that nothing else holds (products' gradients come back reshaped); its references: the
    # view's, this local's and getrefcount's argument
    return getattr(base, "base", 0) is None and base.size == array.size and sys.getrefcount(base) == 3


def add_gradients(prev, new, prev_unshared=False):
    """``prev + new`` for two gradients of one output; in place in ``prev`` when the caller holds the only
    reference to it (``prev_unshared``) and it owns its memory."""
    if type(new) is RowUpdates or type(prev) is RowUpdates:
        if type(prev) is RowUpdates:  # dense + rows commutes bit for bit: add into the dense one
            if type(new) is RowUpdates:
                return new.add_to(prev.dense())
            prev, new, prev_unshared = new, prev, False  # the dense one just arrived: the engine may still hold it
        if prev.shape != new.shape or prev.dtype != new.dtype:
            return prev + new.dense()
        return new.add_to(prev if _in_place_ok(prev, prev_unshared) else prev.copy())
    if (type(prev) is type(new) and prev.shape == new.shape and prev.dtype == new.dtype and is_device_array(prev)
            and _in_place_ok(prev, prev_unshared)):
        prev += new
        return prev
    return prev + new
