"""One optimizer step of a run: gradient accumulation over micro-batches (DDP all-reduces only the last one),
the loss averaged over ranks, gradient clipping, the learning-rate schedule, and the non-finite check.

A step whose loss or gradient norm is not finite is skipped (no update); every rank sees the same loss and the
same all-reduced gradients, so they all skip together.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from ..optim.lr_scheduler import cosine_with_warmup
from .evaluation import to_device_tensor
from .layout import Layout, step_seed  # noqa: F401  (step_seed is part of this module's interface)


def _next_batch(loader, train_cfg):
    if train_cfg.overfit_single_batch:
        loader.reset()
    return loader.next_batch()


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    finite: bool  # the loss (and, without a GradScaler, the gradient norm) was finite
    updated: bool  # the optimizer stepped (False: skipped for a non-finite loss or an overflow the scaler caught)
    loss_scale: float = None  # the GradScaler's scale for this step (fp16-mixed)


def train_step(model, params, optimizer, loader, train_cfg, step, grad_accum, device, seed, amp=None, scaler=None,
               layout=None):
    """Forward and backward over ``grad_accum`` micro-batches (the forward under ``amp()``, the loss scaled by
    ``scaler`` when given), then unscale, clip, schedule and (when finite) update. ``layout``: the run's
    Layout (default: data parallel over the world)."""
    layout = layout or Layout()
    layout.seed_step(seed, step)
    optimizer.zero_grad(set_to_none=True)
    params = list(params)
    amp = amp or contextlib.nullcontext

    def backward(loss):
        loss = loss / grad_accum
        (loss if scaler is None else scaler.scale(loss)).backward()
        return loss

    if layout.pipeline_parallel:  # the micro-batches go through the stages in the schedule's order
        if scaler is not None:  # only the last stage scales a loss; the others backpropagate its scaled gradient
            scaler.expect_scaled_gradients()
        batches = [_next_batch(loader, train_cfg) for _ in range(grad_accum)]
        loss_sum = model.train_step([to_device_tensor(x, device) for x, _ in batches],
                                    [to_device_tensor(y, device) for _, y in batches], backward, amp)
    else:
        loss_sum = 0.0
        ddp = hasattr(model, "no_sync")
        for micro in range(grad_accum):
            x, y = _next_batch(loader, train_cfg)
            last = micro == grad_accum - 1
            with model.no_sync() if ddp and not last else contextlib.nullcontext():
                with amp():
                    _, loss = model(to_device_tensor(x, device), to_device_tensor(y, device))
                loss_sum += backward(loss).item()
    loss_sum = layout.mean_over_data(loss_sum)
    layout.finish_gradients(model, optimizer)
    scale = None
    if scaler is not None:
        scale = scaler.get_scale()
        scaler.unscale_(optimizer)  # clip the true gradients
    max_norm = train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf")
    norm = layout.clip(params, optimizer, max_norm)
    lr = cosine_with_warmup(step, train_cfg.learning_rate, train_cfg.warmup_iters, train_cfg.num_iterations,
                            train_cfg.learning_rate_decay_frac)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if scaler is not None:  # the scaler skips an overflowed step itself and backs off; only the loss can diverge
        finite = math.isfinite(loss_sum)
        scaler.step(optimizer)
        scaler.update()
        updated = finite and scaler.get_scale() >= scale
        return StepResult(loss_sum, norm, lr, finite, updated, scale)
    finite = math.isfinite(loss_sum) and math.isfinite(norm)
    if finite:
        optimizer.step()
    return StepResult(loss_sum, norm, lr, finite, finite)
