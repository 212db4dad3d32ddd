"""Adam (L2 weight decay) and AdamW (decoupled weight decay), torch's single-tensor update, in place.

Each step reuses two preallocated scratch buffers per parameter (``out=`` ufuncs): no allocation in the
hot loop beyond them.
"""
from __future__ import annotations

import math

from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer


class Adam(Optimizer):
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        name = type(self).__name__
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"{name}: expected lr, eps, weight_decay >= 0, got {lr}, {eps}, {weight_decay}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{name}: expected betas in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = p.device.array_module()
                grad, param = p.grad.array, p.array
                state = self._state_for(p)
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = xp.zeros_like(param)
                    state["exp_avg_sq"] = xp.zeros_like(param)
                scratch = state.get("_scratch")
                if scratch is None or scratch.shape != param.shape:
                    scratch = state["_scratch"] = xp.empty_like(param)
                state["step"] += 1
                step = state["step"]
                if wd:
                    if self.decoupled:
                        param *= 1 - lr * wd
                    else:
                        grad = grad + wd * param
                m, v = state["exp_avg"], state["exp_avg_sq"]
                # m = b1 m + (1 - b1) g ; v = b2 v + (1 - b2) g^2
                m *= b1
                xp.multiply(grad, 1 - b1, out=scratch)
                m += scratch
                v *= b2
                xp.multiply(grad, grad, out=scratch)
                scratch *= 1 - b2
                v += scratch
                bias1 = 1 - b1 ** step
                bias2 = 1 - b2 ** step
                step_size = lr / bias1
                # param -= step_size * m / (sqrt(v) / sqrt(bias2) + eps)
                xp.sqrt(v, out=scratch)
                scratch /= math.sqrt(bias2)
                scratch += eps
                xp.divide(m, scratch, out=scratch)
                scratch *= step_size
                param -= scratch
                p._version[0] += 1

    def state_dict(self):
        sd = super().state_dict()
        for st in sd["state"].values():
            st.pop("_scratch", None)
        return sd


class AdamW(Adam):
    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
