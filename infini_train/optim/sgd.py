"""SGD with momentum, dampening, Nesterov and L2 weight decay (torch's update rule), in place."""
from __future__ import annotations

from ..autograd.grad_mode import no_grad
from .optimizer import Optimizer


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: expected lr, momentum, weight_decay >= 0, got {lr}, {momentum}, {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    @no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mom, damp, wd = group["lr"], group["momentum"], group["dampening"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                xp = p.device.array_module()
                d_p = p.grad.array
                if wd:
                    d_p = d_p + wd * p.array
                if mom:
                    state = self._state_for(p)
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = xp.array(d_p, copy=True)
                    else:
                        buf *= mom
                        buf += (1 - damp) * d_p
                    d_p = d_p + mom * buf if group["nesterov"] else buf
                xp.subtract(p.array, lr * d_p, out=p.array)
                p._version[0] += 1
