"""Learning-rate schedules, torch.optim.lr_scheduler's API (the base class is in lr_base.py).

Chainable schedulers (MultiplicativeLR, StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR, PolynomialLR,
CosineAnnealingLR) compute each step's lr from the group's current lr, with torch's recursive formulas, so several
on one optimizer compose (ExponentialLR then MultiStepLR multiplies both factors in) and a single one gives torch's
values; ``step(epoch)`` uses their closed forms. LambdaLR and the schedules in lr_cycles.py (warm restarts, 1cycle,
cosine with warmup) set the lr outright from each group's ``initial_lr``, as torch's do. SequentialLR runs
schedulers one after another, ChainedScheduler steps several together, ReduceLROnPlateau (lr_plateau.py) follows a
metric."""
from __future__ import annotations

import bisect
import math
from collections import Counter

from .lr_base import LRScheduler, _check_optimizer, _per_group  # noqa: F401  (_per_group: part of the interface)
from .lr_cycles import CosineAnnealingWarmRestarts, CosineWithWarmup, OneCycleLR, cosine_with_warmup
from .lr_plateau import ReduceLROnPlateau


def _lambdas(name, optimizer, lr_lambda):
    n = len(optimizer.param_groups)
    lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
    if len(lambdas) != n:
        raise ValueError(f"{name}: expected {n} lr_lambdas (one per param group), got {len(lambdas)}")
    for f in lambdas:
        if not callable(f):
            raise TypeError(f"{name}: lr_lambda should be a function, got {type(f).__name__}\nHINT: pass e.g. "
                            "lambda epoch: 0.95 ** epoch")
    return lambdas


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(iteration); one lambda, or one per param group (sets the lr outright)."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer("LambdaLR", optimizer)
        self.lr_lambdas = _lambdas("LambdaLR", optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class MultiplicativeLR(LRScheduler):
    """Each step multiplies the current lr by lr_lambda(iteration); one lambda, or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer("MultiplicativeLR", optimizer)
        self.lr_lambdas = _lambdas("MultiplicativeLR", optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return self._current_lrs()
        return [g["lr"] * f(self.last_epoch) for g, f in zip(self.optimizer.param_groups, self.lr_lambdas)]


class StepLR(LRScheduler):
    """Multiplies the lr by gamma every ``step_size`` iterations: initial_lr * gamma ** (iteration // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size:
            return self._current_lrs()
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiplies the lr by gamma at each milestone (gamma ** k at a milestone listed k times)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect.bisect_right(milestones, self.last_epoch) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """Multiplies the lr by gamma every iteration."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:
            return self._current_lrs()
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """Multiplies the lr by ``factor`` for the first ``total_iters`` iterations, then gives the factor back."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 < factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in (0, 1], got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in self.optimizer.param_groups]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [g["lr"] * (1.0 / self.factor) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """The factor on the lr moves linearly from start_factor to end_factor over ``total_iters``.

    As in torch, ``total_iters <= 0`` keeps the factor at start_factor."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError(f"LinearLR: start_factor (the multiplicative factor at iteration 0) must be in (0, 1], "
                             f"got {start_factor}\nHINT: a warmup from 10% of the lr is start_factor=0.1")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError(f"LinearLR: end_factor (the multiplicative factor after total_iters) must be in [0, 1], "
                             f"got {end_factor}\nHINT: end_factor=1.0 ends at each group's initial lr")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in self.optimizer.param_groups]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        rise = self.end_factor - self.start_factor
        factor = 1.0 + rise / (self.total_iters * self.start_factor + (self.last_epoch - 1) * rise)
        return [g["lr"] * factor for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        t = min(self.total_iters, self.last_epoch)
        return [base * (self.start_factor + (self.end_factor - self.start_factor) * t / self.total_iters)
                for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Decays the lr to 0 over ``total_iters``: initial_lr * (1 - iteration / total_iters) ** power."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        factor = ((1.0 - self.last_epoch / self.total_iters)
                  / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
        return [g["lr"] * factor for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self):
        t = min(self.total_iters, self.last_epoch)
        return [base * (1.0 - t / self.total_iters) ** self.power for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * iteration / T_max)) / 2, stepped recursively from the
    current lr (so it composes with other schedulers, and past T_max it rises again, as torch's does)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, groups = self.last_epoch, self.optimizer.param_groups
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and t > 0:
            return self._get_closed_form_lr()
        if (t - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [g["lr"] + (base - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        ratio = (1 + math.cos(math.pi * t / self.T_max)) / (1 + math.cos(math.pi * (t - 1) / self.T_max))
        return [ratio * (g["lr"] - self.eta_min) + self.eta_min for g in groups]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


def _check_schedulers(name, optimizer, schedulers):
    for i, s in enumerate(schedulers):
        if not hasattr(s, "optimizer"):
            raise TypeError(f"{name}: schedulers[{i}] should have `optimizer` as its attribute, got "
                            f"{type(s).__name__}\nHINT: pass scheduler objects, e.g. [LinearLR(opt), "
                            "CosineAnnealingLR(opt, T_max)]")
        if isinstance(s, ReduceLROnPlateau):
            raise ValueError(f"{name}: schedulers[{i}] is a ReduceLROnPlateau, whose step() needs the metric\nHINT: "
                             "step the ReduceLROnPlateau yourself after the others")
        if s.optimizer is not optimizer:
            raise ValueError(f"{name}: expects all schedulers to belong to the same optimizer, but "
                             f"schedulers[{i}] ({type(s).__name__}) drives a different one\nHINT: build every "
                             f"scheduler on the optimizer given to {name}")


class SequentialLR(LRScheduler):
    """Runs ``schedulers[i]`` from ``milestones[i - 1]`` on; at a milestone the next scheduler starts over from
    its iteration 0 (torch's semantics). All schedulers must drive ``optimizer``."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR: expects at least one scheduler, got none")
        _check_schedulers("SequentialLR", optimizer, schedulers)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: expects one milestone fewer than schedulers, got {len(schedulers)} "
                             f"schedulers and {len(milestones)} milestones\nHINT: milestones[i] is the iteration "
                             "at which schedulers[i + 1] takes over")
        self._schedulers, self._milestones = schedulers, milestones
        self.optimizer = optimizer
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self._undo_initial_step()  # each scheduler's construction already took its first step
        first = schedulers[bisect.bisect_right(milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def _undo_initial_step(self):
        for scheduler in self._schedulers:
            scheduler._undo_initial_step()

    def step(self):
        """Advance one iteration: the active scheduler steps, or the next one starts at a milestone."""
        self.last_epoch += 1
        idx = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        """This scheduler's counters and milestones, and each wrapped scheduler's state_dict."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state):
        state = dict(state)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        active = bisect.bisect_right(self._milestones, self.last_epoch)
        # the active scheduler loads last, so its lrs (and momenta) are the ones left in the groups
        for i in sorted(range(len(inner)), key=lambda i: i == active):
            self._schedulers[i].load_state_dict(inner[i])
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


class ChainedScheduler(LRScheduler):
    """Steps every scheduler of ``schedulers`` at each ``step()``, in order: their factors compose (the same as
    stepping each by hand). ``optimizer`` defaults to the first scheduler's."""

    def __init__(self, schedulers, optimizer=None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler: expects at least one scheduler to be chained, got none")
        optimizer = optimizer or getattr(schedulers[0], "optimizer", None)
        _check_schedulers("ChainedScheduler", optimizer, schedulers)
        self._schedulers, self.optimizer = schedulers, optimizer
        self._last_lr = self._current_lrs()

    def step(self):
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = self._current_lrs()

    _undo_initial_step = SequentialLR._undo_initial_step
    state_dict = SequentialLR.state_dict

    def load_state_dict(self, state):
        state = dict(state)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, saved in zip(self._schedulers, inner):  # in stepping order: the last writes the lrs
            scheduler.load_state_dict(saved)
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


__all__ = ["LRScheduler", "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ExponentialLR", "ConstantLR",
           "LinearLR", "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
           "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau", "CosineWithWarmup", "cosine_with_warmup"]
