"""SGD with momentum, dampening, Nesterov and L2 weight decay: torch's single-tensor update, in place.

    d = grad (+ weight_decay * param)
    buf = d                                   on the first step
    buf = momentum * buf + (1 - dampening) * d afterwards
    d = d + momentum * buf  (nesterov)  or  d = buf
    param -= lr * d

Every step works in the momentum buffer and the optimizer's workspace (``out=`` ufuncs, piecewise on CPU; see
optimizer.py); the gradient itself is never modified.
"""
from __future__ import annotations

import functools

from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer
from .torch_flags import SGD_FLAGS, flags


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: expected lr, momentum, weight_decay >= 0, got {lr}, {momentum}, {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize,
                                      **flags("SGD", SGD_FLAGS, foreach, False, differentiable, fused)))

    @no_grad()
    def step(self, closure=None):
        """One update; ``closure`` (optional) recomputes the loss and gradients first, and its result is returned."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            options = dict(lr=float(group["lr"]), mom=float(group["momentum"]), damp=float(group["dampening"]),
                           wd=float(group["weight_decay"]), nesterov=group["nesterov"], maximize=group["maximize"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = p.device.array_module()
                arrays = [p.array, p.grad.array]
                first = False
                if options["mom"]:
                    state = self.state.setdefault(p, {})
                    if "momentum_buffer" not in state:
                        with p.device.context():
                            state["momentum_buffer"] = xp.empty_like(p.array)
                        first = True
                    arrays.append(state["momentum_buffer"])
                rows = 2 if options["nesterov"] and (options["wd"] or options["maximize"]) else 1
                self._update_pieces(p.device, arrays, rows, functools.partial(_sgd_update, xp, first=first, **options))
                p._version[0] += 1
        return loss


def _sgd_update(xp, pieces, lr, mom, damp, wd, nesterov, maximize, first):
    param, grad = pieces[0], pieces[1]
    buf = pieces[2] if mom else None
    scratch = pieces[3] if mom else pieces[2]
    d = grad
    if wd:
        xp.multiply(param, wd, out=scratch)
        if maximize:
            scratch -= grad
        else:
            scratch += grad
        d = scratch
    elif maximize:
        xp.negative(grad, out=scratch)
        d = scratch
    if mom:
        if first:
            xp.copyto(buf, d)
        else:
            buf *= mom
            if damp:
                xp.multiply(d, 1.0 - damp, out=scratch)  # d is not needed after this: no nesterov with dampening
                buf += scratch
            else:
                buf += d
        if nesterov:
            if d is scratch:
                extra = pieces[-1]
                xp.multiply(buf, mom, out=extra)
                scratch += extra
            else:
                xp.multiply(buf, mom, out=scratch)
                scratch += d
            d = scratch
        else:
            d = buf
    xp.multiply(d, lr, out=scratch)
    param -= scratch
