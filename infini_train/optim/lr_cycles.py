"""Schedules computed in closed form from each group's initial lr, which set the lr outright (as torch's do): SGDR
warm restarts, the 1cycle policy, and llm.c's linear warmup + cosine decay."""
from __future__ import annotations

import math

from .lr_base import LRScheduler, _check_optimizer, _per_group


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR: lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2, where T_cur counts the
    iterations since the last restart and the period T_i starts at T_0 and grows by T_mult at each restart.

    ``step(epoch)`` takes a fractional epoch (e.g. ``epoch + batch / batches_per_epoch``), as torch does."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        if not isinstance(T_0, int) or T_0 <= 0:
            raise ValueError(f"CosineAnnealingWarmRestarts: expected a positive integer T_0, got {T_0!r}\n"
                             "HINT: T_0 is the number of iterations until the first restart")
        if not isinstance(T_mult, int) or T_mult < 1:
            raise ValueError(f"CosineAnnealingWarmRestarts: expected an integer T_mult >= 1, got {T_mult!r}\n"
                             "HINT: T_mult=1 keeps the period, 2 doubles it after every restart")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"CosineAnnealingWarmRestarts: expected a float or int eta_min, got {eta_min!r} of "
                             f"type {type(eta_min).__name__}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch=None):
        """Advance one iteration, or jump to ``epoch`` (int or float >= 0) and find its restart period."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"CosineAnnealingWarmRestarts.step: expected a non-negative epoch, got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:  # restarts so far: the n with T_0 * (T_mult**n - 1) / (T_mult - 1) <= epoch
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._apply(self.get_lr())


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the lr anneals from max_lr / div_factor up to max_lr over the first ``pct_start`` of
    ``total_steps``, then down to initial_lr / final_div_factor (with ``three_phase``: back to the initial lr
    first, symmetric to the rise, then down to the minimum). With ``cycle_momentum`` the momentum (SGD's
    ``momentum``, Adam's ``betas[0]``) moves inversely between max_momentum and base_momentum.

    The per-group bounds live in the param groups (``initial_lr``, ``max_lr``, ``min_lr``, ``max_momentum``,
    ``base_momentum``), as torch keeps them, so the optimizer's state_dict carries them.
    """

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95,
                 div_factor=25.0, final_div_factor=1e4, three_phase=False, last_epoch=-1):
        _check_optimizer("OneCycleLR", optimizer)
        self.optimizer = optimizer
        self.total_steps = _one_cycle_total_steps(total_steps, epochs, steps_per_epoch)
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: expected a float pct_start between 0 and 1, got {pct_start!r}\n"
                             "HINT: pct_start is the fraction of the cycle spent raising the lr, e.g. 0.3")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be one of 'cos' or 'linear', got {anneal_strategy!r}")
        self._anneal_func_type = anneal_strategy
        self._schedule_phases = _one_cycle_phases(self.total_steps, pct_start, three_phase)
        max_lrs = _per_group("OneCycleLR", "max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for group, peak in zip(optimizer.param_groups, max_lrs):
                group["initial_lr"] = peak / div_factor
                group["max_lr"] = peak
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            defaults = getattr(optimizer, "defaults", {})
            if "momentum" not in defaults and "betas" not in defaults:
                raise ValueError(f"OneCycleLR: cycle_momentum needs an optimizer with momentum or betas, got "
                                 f"{type(optimizer).__name__}\nHINT: pass cycle_momentum=False")
            self.use_beta1 = "betas" in defaults
            max_moms = _per_group("OneCycleLR", "max_momentum", optimizer, max_momentum)
            base_moms = _per_group("OneCycleLR", "base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for group, top, low in zip(optimizer.param_groups, max_moms, base_moms):
                    self._set_momentum(group, top)
                    group["max_momentum"], group["base_momentum"] = top, low
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _set_momentum(self, group, momentum):
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def _lr_and_momentum(self, group, step_num):
        start_step = 0.0
        for i, phase in enumerate(self._schedule_phases):
            end_step = phase["end_step"]
            if step_num <= end_step or i == len(self._schedule_phases) - 1:
                pct = (step_num - start_step) / (end_step - start_step)
                lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                if not self.cycle_momentum:
                    return lr, None
                return lr, self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct)
            start_step = end_step

    def get_lr(self):
        """The lrs at ``last_epoch``; with cycle_momentum, also writes each group's momentum (as torch does)."""
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {step_num} times; the specified number of total steps is "
                             f"{self.total_steps}\nHINT: total_steps (or epochs * steps_per_epoch) must cover every "
                             "scheduler.step() of the run")
        lrs = []
        for group in self.optimizer.param_groups:
            lr, momentum = self._lr_and_momentum(group, step_num)
            lrs.append(lr)
            if self.cycle_momentum:
                self._set_momentum(group, momentum)
        return lrs

    def load_state_dict(self, state):
        """Restore the state, then the lrs and momenta of the restored iteration into the optimizer's groups."""
        super().load_state_dict(state)
        if self.cycle_momentum and self.last_epoch <= self.total_steps:
            for group in self.optimizer.param_groups:
                self._set_momentum(group, self._lr_and_momentum(group, self.last_epoch)[1])


def _one_cycle_total_steps(total_steps, epochs, steps_per_epoch):
    if total_steps is not None:
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"OneCycleLR: expected a positive integer total_steps, got {total_steps!r}")
        return total_steps
    if epochs is not None and steps_per_epoch is not None:
        if not isinstance(epochs, int) or epochs <= 0:
            raise ValueError(f"OneCycleLR: expected a positive integer epochs, got {epochs!r}")
        if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
            raise ValueError(f"OneCycleLR: expected a positive integer steps_per_epoch, got {steps_per_epoch!r}")
        return epochs * steps_per_epoch
    raise ValueError("OneCycleLR: you must define either total_steps OR (epochs AND steps_per_epoch)\n"
                     "HINT: OneCycleLR(opt, max_lr, total_steps=1000) or (..., epochs=10, steps_per_epoch=100)")


def _one_cycle_phases(total_steps, pct_start, three_phase):
    """torch's phase table: each phase ends at ``end_step`` and names the group keys it anneals between."""
    def phase(end_step, lrs, momenta):
        return {"end_step": end_step, "start_lr": lrs[0], "end_lr": lrs[1], "start_momentum": momenta[0],
                "end_momentum": momenta[1]}

    rise = float(pct_start * total_steps) - 1
    if three_phase:
        return [phase(rise, ("initial_lr", "max_lr"), ("max_momentum", "base_momentum")),
                phase(float(2 * pct_start * total_steps) - 2, ("max_lr", "initial_lr"),
                      ("base_momentum", "max_momentum")),
                phase(total_steps - 1, ("initial_lr", "min_lr"), ("max_momentum", "max_momentum"))]
    return [phase(rise, ("initial_lr", "max_lr"), ("max_momentum", "base_momentum")),
            phase(total_steps - 1, ("max_lr", "min_lr"), ("base_momentum", "max_momentum"))]


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
            self.optimizer, self.base_lrs, self.last_epoch, self._step_count = None, [max_lr], last_epoch, 0
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


__all__ = ["CosineAnnealingWarmRestarts", "OneCycleLR", "CosineWithWarmup", "cosine_with_warmup"]
