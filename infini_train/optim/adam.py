"""Adam (L2 weight decay) and AdamW (decoupled weight decay): torch's single-tensor update, in place.

    g = grad (+ weight_decay * param for Adam)          param *= 1 - lr * weight_decay  (AdamW)
    m = lerp(m, g, 1 - beta1)                           v = beta2 * v + (1 - beta2) * g * g
    param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Each step runs in the state arrays and the optimizer's workspace (one scratch row, a second for Adam's L2
weight decay or ``maximize``, which must not touch ``.grad``), piecewise on CPU and shared among the host
threads (see optimizer.py): no allocation in the hot loop.

``offload``: the state store (offload.py) keeping the state arrays in host memory or in a file per rank; the update then
runs on the host over the chunks the store reads and writes back, the same arithmetic, so the same bits.
"""
from __future__ import annotations

import functools

from ..autograd.grad_mode import no_grad
from ..kernels import adam as adam_kernel
from .optimizer import Optimizer
from .torch_flags import ADAM_FLAGS, flags


class Adam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, offload=None):
        name = type(self).__name__
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"{name}: expected lr, eps, weight_decay >= 0, got {lr}, {eps}, {weight_decay}")
        if len(betas) != 2 or not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{name}: expected two betas in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                                      **flags(name, ADAM_FLAGS, foreach, capturable, differentiable, fused),
                                      decoupled_weight_decay=bool(decoupled_weight_decay)), offload)
        self.state_store.reserve([p for g in self.param_groups for p in g["params"]], 3 if amsgrad else 2)

    @no_grad()
    def step(self, closure=None):
        """One update; ``closure`` (optional) recomputes the loss and gradients first, and its result is returned."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            b1, b2 = float(group["betas"][0]), float(group["betas"][1])
            decoupled, amsgrad, maximize = group["decoupled_weight_decay"], group["amsgrad"], group["maximize"]
            l2 = bool(wd) and not decoupled
            keys = _KEYS + (("max_exp_avg_sq",) if amsgrad else ())
            store = self.state_store
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    for key in keys:
                        state[key] = store.zeros(p, key)
                state["step"] += 1
                step = state["step"]
                states = [state[key] for key in keys]
                if store.kind == "none" and p.device.type != "cpu" and not (amsgrad or maximize) and adam_kernel.step(
                        p.array, p.grad.array, *states, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd,
                        decoupled=decoupled, step_number=step):  # one fused pass on GPUs, the same bits (kernels/)
                    p._version[0] += 1
                    continue
                rows = 2 if l2 or maximize else 1
                options = dict(lr=lr, b1=b1, b2=b2, eps=eps, wd=wd, l2=l2, decoupled=decoupled, amsgrad=amsgrad,
                               maximize=maximize, step_size=lr / (1.0 - b1 ** step),
                               bias_correction2_sqrt=(1.0 - b2 ** step) ** 0.5)
                for device, arrays in store.chunks(p, states):  # the whole arrays, or offloaded: chunk by chunk
                    update = functools.partial(_adam_update, device.array_module(), **options)
                    self._update_pieces(device, arrays, rows, update)
                p._version[0] += 1
        return loss


_KEYS = ("exp_avg", "exp_avg_sq")


def _adam_update(xp, pieces, lr, b1, b2, eps, wd, l2, decoupled, amsgrad, maximize, step_size,
                 bias_correction2_sqrt):
    """One piece of the update: param, grad, exp_avg, exp_avg_sq (, max_exp_avg_sq), then the scratch rows."""
    param, grad, m, v = pieces[:4]
    scratch = pieces[4 + amsgrad]
    g = grad
    if l2 or maximize:
        g = pieces[-1]
        if l2:
            xp.multiply(param, wd, out=g)  # grad + wd * param, without touching .grad
            if maximize:
                g -= grad
            else:
                g += grad
        else:
            xp.negative(grad, out=g)
    if wd and decoupled:
        param *= 1.0 - lr * wd
    _lerp_(xp, m, g, 1.0 - b1, scratch)
    v *= b2
    xp.multiply(g, 1.0 - b2, out=scratch)  # addcmul: (value * g) * g
    scratch *= g
    v += scratch
    if amsgrad:
        v = xp.maximum(pieces[4], v, out=pieces[4])
    xp.sqrt(v, out=scratch)  # denom = sqrt(v) / sqrt(1 - b2^t) + eps
    scratch /= bias_correction2_sqrt
    scratch += eps
    xp.divide(m, scratch, out=scratch)
    scratch *= step_size
    param -= scratch


def _lerp_(xp, start, end, weight, scratch):
    """start += weight * (end - start) in place, with torch's two formulas for small and large weights."""
    xp.subtract(end, start, out=scratch)
    if weight < 0.5:
        scratch *= weight
        start += scratch
    else:
        scratch *= 1.0 - weight
        xp.subtract(end, scratch, out=start)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): param *= 1 - lr * weight_decay each step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None, offload=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True, offload=offload)

