"""ReduceLROnPlateau: lower the lr when a metric stops improving (torch.optim.lr_scheduler.ReduceLROnPlateau)."""
from __future__ import annotations

import math

from .lr_base import LRScheduler, _check_optimizer, _per_group


class ReduceLROnPlateau(LRScheduler):
    """``step(metric)`` once per evaluation: after more than ``patience`` evaluations without improvement (better
    than the best by ``threshold``, relative or absolute), every group's lr is multiplied by ``factor`` (not below
    its ``min_lr``; a change smaller than ``eps`` is skipped), then ``cooldown`` evaluations are ignored.
    ``mode="max"`` for metrics that should rise (accuracy)."""

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4, threshold_mode="rel",
                 cooldown=0, min_lr=0, eps=1e-8):
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: expected factor < 1.0, got {factor}\nHINT: factor multiplies the lr "
                             "on a plateau, e.g. 0.1 or 0.5")
        _check_optimizer("ReduceLROnPlateau", optimizer)
        self.factor = factor
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            self.default_min_lr = None
            self.min_lrs = _per_group("ReduceLROnPlateau", "min_lr", optimizer, min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.last_epoch = 0
        self._step_count = 0
        self._last_lr = self._current_lrs()
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: expected mode 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: expected threshold_mode 'rel' or 'abs', got {threshold_mode!r}")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def _reset(self):
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self):
        return self.cooldown_counter > 0

    def is_better(self, current, best):
        if self.mode == "min":
            return current < best * (1.0 - self.threshold) if self.threshold_mode == "rel" else \
                current < best - self.threshold
        return current > best * (1.0 + self.threshold) if self.threshold_mode == "rel" else \
            current > best + self.threshold

    def step(self, metrics, epoch=None):
        """Record one evaluation of the metric (a float or a one-element tensor)."""
        current = float(metrics.item() if hasattr(metrics, "item") else metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        self._step_count += 1
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad evaluations in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._current_lrs()

    def _reduce_lr(self):
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(f"ReduceLROnPlateau: the optimizer has {len(groups)} param groups, but min_lr "
                                   f"was given for {len(self.min_lrs)}\nHINT: a param group was added after the "
                                   "scheduler was built; set scheduler.min_lrs to one value per group")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, floor in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, floor)
            if old - new > self.eps:
                group["lr"] = new

    def load_state_dict(self, state):
        """Restore the counters, the best metric and the last lrs (into the optimizer's groups)."""
        super().load_state_dict(state)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


__all__ = ["ReduceLROnPlateau"]
