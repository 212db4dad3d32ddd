"""Learning-rate schedules. ``step()`` advances one iteration and writes each group's lr."""
from __future__ import annotations

import math


class LRScheduler:
    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        for g in optimizer.param_groups:
            g.setdefault("initial_lr", g["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def get_lr(self):
        raise NotImplementedError

    def step(self):
        self.last_epoch += 1
        for g, lr in zip(self.optimizer.param_groups, self.get_lr()):
            g["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self):
        return list(self._last_lr)

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state):
        self.__dict__.update(state)
        for g, lr in zip(self.optimizer.param_groups, self._last_lr):
            g["lr"] = lr


class LambdaLR(LRScheduler):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for base, f in zip(self.base_lrs, self.lr_lambdas)]


class StepLR(LRScheduler):
    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr * factor for the first ``total_iters`` steps, then lr (torch semantics)."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        f = self.factor if self.last_epoch < self.total_iters else 1.0
        return [base * f for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t = self.last_epoch
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2
                for base in self.base_lrs]


def cosine_with_warmup(it, max_lr, warmup_iters, num_iterations, final_lr_frac=0.0):
    """llm.c's schedule: linear warmup to max_lr, then cosine decay to max_lr * final_lr_frac."""
    min_lr = max_lr * final_lr_frac
    if it < warmup_iters:
        return max_lr * (it + 1) / warmup_iters
    if it >= num_iterations:
        return min_lr
    decay_ratio = (it - warmup_iters) / max(num_iterations - warmup_iters, 1)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (max_lr - min_lr)


class CosineWithWarmup(LRScheduler):
    """cosine_with_warmup as a scheduler; each group's own lr is its max_lr."""

    def __init__(self, optimizer, warmup_iters, num_iterations, final_lr_frac=0.0, last_epoch=-1):
        self.warmup_iters, self.num_iterations, self.final_lr_frac = warmup_iters, num_iterations, final_lr_frac
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [cosine_with_warmup(self.last_epoch, base, self.warmup_iters, self.num_iterations, self.final_lr_frac)
                for base in self.base_lrs]
