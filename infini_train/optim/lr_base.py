"""The learning-rate scheduler base class (torch.optim.lr_scheduler.LRScheduler's protocol).

Construction takes the first step (iteration 0); each ``step()`` advances one iteration and writes every group's lr.
Chainable schedulers compute the next lr from each group's current ``lr`` (torch's recursive form), so two
schedulers on one optimizer compose: each multiplies in its own factor. ``step(epoch)`` jumps to ``epoch`` through
the scheduler's closed form (``_get_closed_form_lr``) where it has one, as torch's deprecated form does.
"""
from __future__ import annotations


def _check_optimizer(name, optimizer):
    if not hasattr(optimizer, "param_groups"):
        raise TypeError(f"{name}: expected an Optimizer, got {type(optimizer).__name__}\nHINT: pass the optimizer "
                        "whose learning rates to schedule, e.g. optim.SGD(model.parameters(), lr=0.1)")


def _per_group(scheduler, arg, optimizer, value):
    """``value`` for each param group: a list/tuple with one entry per group, or one value for all."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{scheduler}: {arg} must have the same length as optimizer.param_groups; {arg} has "
                             f"{len(value)} values, param_groups has {n}\nHINT: give one value, or one per group")
        return list(value)
    return [value] * n


class LRScheduler:
    _is_initial = False  # True during the step construction takes (resuming must not advance the lr twice)

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(type(self).__name__, optimizer)
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
        self._initial_step()

    def _initial_step(self):
        """The step construction takes (SequentialLR repeats it for the scheduler that runs first)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        """The lr of every param group at iteration ``last_epoch`` (chainable schedulers: from the current lrs)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr")

    def _get_closed_form_lr(self):
        """The lrs at iteration ``last_epoch`` from the base lrs (``step(epoch)``); a scheduler without a closed form
        takes its chainable one (``get_lr``)."""
        return self.get_lr()

    def _undo_initial_step(self):
        """Take back the step construction took (SequentialLR starts its schedulers over)."""
        self.last_epoch -= 1

    def step(self, epoch=None):
        """Advance one iteration, or (deprecated in torch, kept for its callers) jump to iteration ``epoch``."""
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            lrs = self.get_lr()
        else:
            self.last_epoch = epoch
            lrs = self._get_closed_form_lr()
        self._apply(lrs)

    def _current_lrs(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def _apply(self, lrs):
        if self.optimizer is None:
            self._last_lr = list(lrs)
            return
        for g, lr in zip(self.optimizer.param_groups, lrs):
            g["lr"] = lr
        self._last_lr = self._current_lrs()

    def get_last_lr(self):
        """The lrs of the param groups after the last ``step()`` (or construction), one per group."""
        return list(self._last_lr)

    def state_dict(self):
        """Everything but the optimizer and callables (lambdas are code, not state)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state):
        """Restore the state and write its last lrs into the optimizer's groups (load chained schedulers in their
        order, as they stepped: the last one's lrs are the composed ones)."""
        self.__dict__.update(state)
        if self.optimizer is not None:
            for g, lr in zip(self.optimizer.param_groups, self._last_lr):
                g["lr"] = lr


__all__ = ["LRScheduler"]
