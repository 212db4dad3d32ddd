"""Learning-rate schedules. Construction applies the lr for iteration 0; each ``step()`` advances one
iteration and writes every group's lr. Schedules are computed in closed form from each group's
``initial_lr`` (torch's values for a single scheduler per optimizer)."""
from __future__ import annotations

import bisect
import math


class LRScheduler:
    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        for i, g in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                g.setdefault("initial_lr", g["lr"])
            elif "initial_lr" not in g:
                raise KeyError(f"{type(self).__name__}: param_groups[{i}] has no 'initial_lr' while resuming with "
                               f"last_epoch={last_epoch}\nHINT: load the optimizer's state_dict first, or use "
                               "last_epoch=-1 and load_state_dict on the scheduler")
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def get_lr(self):
        """The lr of every param group at iteration ``last_epoch``."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr")

    def step(self):
        self.last_epoch += 1
        lrs = self.get_lr()
        if self.optimizer is not None:
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self):
        """The lrs the last ``step()`` (or construction) applied, one per param group."""
        return list(self._last_lr)

    def state_dict(self):
        """Everything but the optimizer and callables (lambdas are code, not state)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state):
        self.__dict__.update(state)
        if self.optimizer is not None:
            for g, lr in zip(self.optimizer.param_groups, self._last_lr):
                g["lr"] = lr


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(iteration); one lambda, or one per param group."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: expected {n} lr_lambdas (one per param group), got {len(self.lr_lambdas)}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (iteration // step_size)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = initial_lr * gamma ** (number of milestones reached)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * self.gamma ** bisect.bisect_right(self.milestones, self.last_epoch) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = initial_lr * factor for the first ``total_iters`` iterations, then initial_lr."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 < factor <= 1:
            raise ValueError(f"ConstantLR: factor must be in (0, 1], got {factor}")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        f = self.factor if self.last_epoch < self.total_iters else 1.0
        return [base * f for base in self.base_lrs]


class LinearLR(LRScheduler):
    """The factor on initial_lr moves linearly from start_factor to end_factor over ``total_iters``."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t = min(self.last_epoch, self.total_iters)
        f = self.start_factor + (self.end_factor - self.start_factor) * t / self.total_iters
        return [base * f for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * iteration / T_max)) / 2."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t = self.last_epoch
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2
                for base in self.base_lrs]


def cosine_with_warmup(it, max_lr, warmup_iters, num_iterations, final_lr_frac=0.0):
    """llm.c train_gpt2's get_lr: linear warmup max_lr * (it + 1) / warmup_iters for it < warmup_iters, then
    cosine decay from max_lr to min_lr = max_lr * final_lr_frac at it = num_iterations (min_lr after)."""
    min_lr = max_lr * final_lr_frac
    if it < warmup_iters:
        return max_lr * (it + 1) / warmup_iters
    if it > num_iterations:
        return min_lr
    decay_ratio = (it - warmup_iters) / max(num_iterations - warmup_iters, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(decay_ratio, 1.0)))
    return min_lr + coeff * (max_lr - min_lr)


class CosineWithWarmup(LRScheduler):
    """``cosine_with_warmup`` as a scheduler; each group's initial lr is its max_lr (or ``max_lr`` if given).

    Also a plain schedule: ``get_lr(it)`` (or calling the object) returns the lr at iteration ``it`` for the
    first group's max_lr, and ``CosineWithWarmup(None, warmup, n, frac, max_lr=6e-4)`` needs no optimizer.
    """

    def __init__(self, optimizer=None, warmup_iters=0, num_iterations=1, final_lr_frac=0.0, max_lr=None,
                 last_epoch=-1):
        if warmup_iters < 0 or num_iterations < 1:
            raise ValueError(f"CosineWithWarmup: expected warmup_iters >= 0 and num_iterations >= 1, got "
                             f"{warmup_iters}, {num_iterations}")
        self.warmup_iters, self.num_iterations, self.final_lr_frac = warmup_iters, num_iterations, final_lr_frac
        if optimizer is None:
            if max_lr is None:
                raise ValueError("CosineWithWarmup: without an optimizer, max_lr is required")
            self.optimizer, self.base_lrs, self.last_epoch = None, [max_lr], last_epoch
            self.step()
            return
        if max_lr is not None and last_epoch == -1:
            for g in optimizer.param_groups:
                g["lr"] = g["initial_lr"] = max_lr
        super().__init__(optimizer, last_epoch)

    def get_lr(self, it=None):
        if it is not None:
            return cosine_with_warmup(it, self.base_lrs[0], self.warmup_iters, self.num_iterations,
                                      self.final_lr_frac)
        return [cosine_with_warmup(self.last_epoch, base, self.warmup_iters, self.num_iterations, self.final_lr_frac)
                for base in self.base_lrs]

    def __call__(self, it):
        return self.get_lr(it)


__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR", "ConstantLR", "LinearLR",
           "CosineAnnealingLR", "CosineWithWarmup", "cosine_with_warmup"]
