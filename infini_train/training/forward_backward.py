"""One forward-backward entry for every layout (as Megatron's get_forward_backward_func): chosen once when the run
is built, it runs a step's micro-batches and leaves their gradients accumulated in the parameters.

    forward_backward = forward_backward_func(dims.pipeline_parallel)
    loss_sum = forward_backward(model, next_batch, grad_accum, backward, forward_context, no_sync)

``next_batch()`` gives the next (inputs, targets, context) -- device tensors and a zero-argument callable whose
context the micro-batch's forwards run under (its packed documents' layout, or a no-op) --, ``backward(loss)`` scales
and backpropagates a micro-batch's loss (returning the scaled loss), ``forward_context()`` wraps each forward
(autocast), ``no_sync`` (DDP's, or None) defers the data-parallel reduction to the last micro-batch. Returns the sum
of the micro-batches' scaled losses (their mean) on this rank.
"""
from __future__ import annotations

import contextlib


def forward_backward_no_pipelining(model, next_batch, grad_accum, backward, forward_context, no_sync=None):
    """The micro-batches one after the other, each loaded just before its forward."""
    loss_sum = 0.0
    for micro in range(grad_accum):
        x, y, context = next_batch()
        last = micro == grad_accum - 1
        with no_sync() if no_sync is not None and not last else contextlib.nullcontext():
            with forward_context(), context():
                _, loss = model(x, y)
            loss_sum += backward(loss).item()
    return loss_sum


def forward_backward_pipelining(model, next_batch, grad_accum, backward, forward_context, no_sync=None):
    """Every micro-batch through the stages in the model's schedule (gpipe, 1f1b or interleaved)."""
    batches = [next_batch() for _ in range(grad_accum)]
    return model.train_step([x for x, _, _ in batches], [y for _, y, _ in batches], backward, forward_context,
                            [context for _, _, context in batches])


def forward_backward_func(pipeline_parallel):
    return forward_backward_pipelining if pipeline_parallel else forward_backward_no_pipelining


__all__ = ["forward_backward_func", "forward_backward_no_pipelining", "forward_backward_pipelining"]
