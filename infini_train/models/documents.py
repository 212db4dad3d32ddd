"""Packed sequences: several documents (fine-tuning samples) side by side in each row of a batch, as SFT packing
lays them out, or one sample per row followed by padding. ``segments`` (B, T) numbers the documents of each row
1, 2, ... (0 on padding) and ``positions`` (B, T) restarts at 0 with every document; inside
``packed_documents(positions, segments)`` a model's causal self-attention keeps each document to itself -- position
i attends to j iff segments[i] == segments[j] != 0 and j <= i (padding attends to itself only, so its softmax stays
finite; its loss is ignored) -- and its positions (GPT-2's position embeddings, LLaMA's rotary tables) are
``positions``, so every document computes exactly what it computes alone in its own batch.

The layout is thread-local and a recomputed block (``train.recompute=block``) runs under the layout its forward ran
under. Incremental decoding (a KV cache) and context parallelism run whole sequences only: asked for together with a
layout, they are refused with a clear error.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from .. import backend
from ..autograd.recompute import register_forward_state
from ..tensor import Tensor


class DocumentLayout:
    """``positions`` and ``segments``: (B, T) integer arrays (see the module docstring)."""

    def __init__(self, positions, segments):
        positions = np.asarray(backend.to_device_array(positions, backend.CPU) if hasattr(positions, "device")
                               else positions)
        segments = np.asarray(backend.to_device_array(segments, backend.CPU) if hasattr(segments, "device")
                              else segments)
        if positions.ndim != 2 or segments.shape != positions.shape:
            raise ValueError(f"packed_documents: expected positions and segments of the same (B, T) shape, got "
                             f"{positions.shape} and {segments.shape}\nHINT: pass the batch's positions and segments "
                             "as the SFT loader gives them")
        if positions.size and positions.min() < 0:
            raise ValueError(f"packed_documents: expected positions >= 0, got {int(positions.min())}")
        self.positions, self.segments = positions.astype(np.int64), segments.astype(np.int64)
        self._masks, self._positions = {}, {}

    @property
    def shape(self):
        return self.positions.shape

    def attention_mask(self, device):
        """(B, 1, T, T) boolean Tensor on ``device``: True where a query may attend to a key."""
        mask = self._masks.get(device)
        if mask is None:
            s = self.segments
            T = s.shape[1]
            same = (s[:, :, None] == s[:, None, :]) & (s[:, :, None] != 0)
            allowed = (same & np.tril(np.ones((T, T), bool))) | np.eye(T, dtype=bool)
            mask = self._masks[device] = Tensor._make(backend.to_device_array(allowed[:, None], device), device)
        return mask

    def position_ids(self, device):
        """(B, T) int64 Tensor of the positions on ``device``."""
        ids = self._positions.get(device)
        if ids is None:
            ids = self._positions[device] = Tensor._make(backend.to_device_array(self.positions, device), device)
        return ids


class _State(threading.local):
    layout = None


_state = _State()


@contextlib.contextmanager
def packed_documents(positions, segments=None):
    """Run forwards over rows of packed documents (``positions``, ``segments``: (B, T)); ``positions`` may be a
    DocumentLayout already, and None runs plain causal sequences."""
    layout = positions if isinstance(positions, DocumentLayout) or positions is None else \
        DocumentLayout(positions, segments)
    previous, _state.layout = _state.layout, layout
    try:
        yield layout
    finally:
        _state.layout = previous


def active_layout():
    """The DocumentLayout forwards run under, or None."""
    return _state.layout


def check_layout(x_shape, where):
    """The active layout, checked against a forward over tokens of shape ``x_shape`` (B, T), or None."""
    layout = _state.layout
    if layout is not None and tuple(x_shape[:2]) != tuple(layout.shape):
        raise ValueError(f"{where}: the packed documents' layout is {tuple(layout.shape)}, the tokens are "
                         f"{tuple(x_shape[:2])}\nHINT: enter packed_documents with the batch's own positions and "
                         "segments")
    return layout


def _restore(layout):
    _state.layout = layout


register_forward_state(active_layout, _restore)

__all__ = ["DocumentLayout", "packed_documents", "active_layout", "check_layout"]
