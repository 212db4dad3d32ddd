"""One optimizer step of a run, the same for every layout: the plan's forward-backward over the micro-batches
(DDP all-reduces only the last one; a pipeline runs its schedule), the loss averaged over ranks, the plan's
gradient synchronisation and clipping, the learning-rate schedule, and the non-finite check. With masked targets
(SFT) every micro-batch's loss is its summed token losses over the same count, derived from the whole global batch,
so the objective is the mean over the global batch's trained tokens whatever the split.

A step whose loss or gradient norm is not finite is skipped (no update); every rank sees the same loss and the
same all-reduced gradients, so they all skip together.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

from ..data.sft_loader import SFTBatch
from ..models.token_loss import loss_over_tokens
from ..nn.parallel.context_parallel import local_chunks
from ..optim.lr_scheduler import cosine_with_warmup
from .evaluation import batch_on_device, to_device_tensor
from .forward_backward import forward_backward_func
from .parallel_dims import ParallelDims, step_seed  # noqa: F401  (step_seed is part of this module's interface)


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
    data_wait_s: float = 0.0  # seconds spent fetching the step's batches (the straggler report's data wait)


@dataclass
class StepPlan:
    """What every step of a run does, decided once when the run is built: the layout's training parts (``layout``: a
    TrainingLayout -- the model as run, the optimizer, the gradient finaliser and clipping, the forward context), the
    micro-batches per step, the device, and the precision's autocast and GradScaler."""

    layout: object
    grad_accum: int
    device: object
    amp: object = None  # () -> the forward's context (autocast), or None
    scaler: object = None  # a GradScaler (fp16-mixed), or None

    def __post_init__(self):
        layout = self.layout
        self.model, self.optimizer, self.dims = layout.model, layout.optimizer, layout.dims
        self.forward_backward = forward_backward_func(self.dims.pipeline_parallel)
        amp = self.amp or contextlib.nullcontext
        forward = layout.forward_context  # (context parallelism: every forward's attention over the context group)
        self.amp = amp if forward is None else lambda: _stacked(amp(), forward())


@contextlib.contextmanager
def _stacked(*contexts):
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield


def tokens_per_micro_batch(batches, dims):
    """For a step's SFT batches (masked targets), the count every micro-batch divides its summed token losses by:
    the trained tokens of the whole global batch over the micro-batches that share it (this rank's times the
    data-parallel ranks), so the step averages over every trained token alike however the batch is split
    (models/token_loss.py). None for token batches, where every target is trained and each micro-batch's mean
    already weighs every token alike."""
    if not isinstance(batches[0], SFTBatch):
        return None
    trained = dims.sum_over_data(sum(int((batch.targets != -1).sum()) for batch in batches))
    return max(trained, 1) / (len(batches) * dims.grad_size)


def train_step(plan, loader, train_cfg, step, seed):
    """One optimizer step: forward and backward over ``plan.grad_accum`` micro-batches (the loss scaled by the
    plan's GradScaler when there is one), gradient synchronisation, unscale, clip, schedule and (when finite)
    update."""
    dims, optimizer, scaler = plan.dims, plan.optimizer, plan.scaler
    dims.seed_step(seed, step)
    optimizer.zero_grad(set_to_none=True)

    def backward(loss):
        loss = loss / plan.grad_accum
        (loss if scaler is None else scaler.scale(loss)).backward()
        return loss

    fetch = time.monotonic()
    batches = [_next_batch(loader, train_cfg) for _ in range(plan.grad_accum)]
    fetch = time.monotonic() - fetch
    count = tokens_per_micro_batch(batches, dims)
    batches = iter(batches)

    def next_batch():
        batch = next(batches)
        if dims.context_parallel:  # this rank's two chunks of every sequence (token batches only: config/checks.py)
            x, y = batch
            return (to_device_tensor(local_chunks(x, dims.cp_group), plan.device),
                    to_device_tensor(local_chunks(y, dims.cp_group), plan.device), contextlib.nullcontext)
        x, y, context = batch_on_device(batch, plan.device)
        if count is None:
            return x, y, context
        return x, y, lambda: _stacked(context(), loss_over_tokens(count))

    if scaler is not None and dims.pipeline_parallel:  # only the last stage scales a loss; the others
        scaler.expect_scaled_gradients()                  # backpropagate its scaled gradient
    loss_sum = plan.forward_backward(plan.model, next_batch, plan.grad_accum, backward, plan.amp,
                                     plan.layout.no_sync)
    loss_sum = dims.mean_over_data(loss_sum)
    plan.layout.finalize_grads()
    scale = None
    if scaler is not None:
        scale = scaler.get_scale()
        scaler.unscale_(optimizer)  # clip the true gradients
    norm = plan.layout.clip_grad_norm(train_cfg.grad_clip if train_cfg.grad_clip > 0 else float("inf"))
    lr = cosine_with_warmup(step, train_cfg.learning_rate, train_cfg.warmup_iters, train_cfg.num_iterations,
                            train_cfg.learning_rate_decay_frac)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if scaler is not None:  # the scaler skips an overflowed step itself and backs off; only the loss can diverge
        finite = math.isfinite(loss_sum)
        scaler.step(optimizer)
        scaler.update()
        updated = finite and scaler.get_scale() >= scale
        return StepResult(loss_sum, norm, lr, finite, updated, scale, fetch)
    finite = math.isfinite(loss_sum) and math.isfinite(norm)
    if finite:
        optimizer.step()
    return StepResult(loss_sum, norm, lr, finite, finite, data_wait_s=fetch)
