"""Activation recomputation for whole transformer blocks (``train.recompute: block``): a block's forward keeps only
its input and is re-run in backward (``it.utils.checkpoint.checkpoint``, dropout masks replayed), so a step holds
one block's activations at a time plus each block's input, for about one extra forward of compute."""
from __future__ import annotations

from ..autograd.grad_mode import is_grad_enabled
from ..autograd.recompute import checkpoint

RECOMPUTE_MODES = ("none", "block")


def run_block(block, recompute, x, *args):
    """``block(x, *args)``, recomputed in backward when ``recompute == "block"`` and a graph is being built."""
    if recompute == "block" and is_grad_enabled():
        return checkpoint(block, x, *args)
    return block(x, *args)


def set_recompute(model, mode):
    """Set ``mode`` ("none" or "block") on every GPT2 / Llama (or pipeline chunk) inside ``model``; returns it."""
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"train.recompute: expected one of {RECOMPUTE_MODES}, got {mode!r}")
    for module in model.modules():
        if hasattr(module, "run_blocks"):
            module.recompute = mode
    return model


__all__ = ["RECOMPUTE_MODES", "run_block", "set_recompute"]
