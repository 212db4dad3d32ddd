"""Loss modules, as torch.nn's: CrossEntropyLoss, NLLLoss, MSELoss, BCEWithLogitsLoss.

Constructor arguments follow torch (positions included). Class weights and ``pos_weight`` are buffers, so they
move with ``to(device)`` and appear in ``state_dict`` as in torch. The deprecated ``size_average`` / ``reduce``
arguments, when given, set ``reduction`` as torch's legacy rule does (with its warning).
"""
from __future__ import annotations

import warnings

from ..creation import tensor
from ..tensor import Tensor
from . import functional as F
from .module import Module

_REDUCTIONS = ("mean", "sum", "none")


def _legacy_reduction(size_average, reduce):
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    reduction = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{reduction}' instead.",
                  stacklevel=3)
    return reduction


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = _legacy_reduction(size_average, reduce)
        if reduction not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def _buffer(self, name, value):
        """Register ``value`` (a Tensor, an array-like or None) as the buffer ``name``."""
        if value is not None and not isinstance(value, Tensor):
            if isinstance(value, (bool, int, float)):
                raise TypeError(f"{type(self).__name__}: {name} must be a Tensor or None, got {value!r}\n"
                                f"HINT: the first argument is weight, as in torch; pass the others by keyword, "
                                f"e.g. {type(self).__name__}(ignore_index=...)")
            value = tensor(value)
        self.register_buffer(name, value)


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self._buffer("weight", weight)


class CrossEntropyLoss(_WeightedLoss):
    """Cross-entropy of logits against class indices or class probabilities (see F.cross_entropy)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class indices given log-probabilities (see F.nll_loss)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class MSELoss(_Loss):
    """Mean squared error (see F.mse_loss)."""

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Sigmoid and binary cross-entropy in one stable step (see F.binary_cross_entropy_with_logits)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean", pos_weight=None):
        super().__init__(size_average, reduce, reduction)
        self._buffer("weight", weight)
        self._buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, weight=self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)
