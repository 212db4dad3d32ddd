"""A run's ``precision``: fp32, bf16-mixed (the forward under bfloat16 autocast, float32 master weights and
optimizer state) or fp16-mixed (float16 autocast and a GradScaler: the loss is scaled before backward and the
gradients unscaled before clipping; a step whose gradients overflowed is skipped and the scale backs off)."""
from __future__ import annotations

import contextlib

from .. import backend
from ..amp import GradScaler, autocast

LOW_DTYPES = {"bf16-mixed": backend.bfloat16, "fp16-mixed": backend.float16}


def autocast_for(precision, device):
    """The context a forward pass runs under for ``precision`` on ``device``."""
    dtype = LOW_DTYPES.get(precision)
    return contextlib.nullcontext() if dtype is None else autocast(device.type, dtype)


def scaler_for(precision, device, train_cfg):
    """A GradScaler for fp16-mixed (starting at ``train_cfg.initial_loss_scale``, doubling after
    ``train_cfg.loss_scale_window`` steps without overflow), else None. Its found-inf flag is reduced over the
    world, so every pipeline stage, data-parallel replica and tensor-parallel rank skips the same steps and keeps
    the same scale."""
    if precision != "fp16-mixed":
        return None
    return GradScaler(device=device.type, init_scale=train_cfg.initial_loss_scale,
                      growth_interval=train_cfg.loss_scale_window)
