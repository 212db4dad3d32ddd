"""DistributedDataParallel.join(): training on uneven inputs, as torch's DDP.join() / Join context.

Inside the context every forward of a rank still training first all-reduces two counters, [1, 1 if this pass will
reduce gradients else 0]. A rank that leaves the context (it ran out of data) keeps answering with [0, 0] and so learns
how many ranks still train and whether they reduce this pass; then it shadows what they do: the buffer broadcast (with
``broadcast_buffers``) and, when they reduce, every bucket's reduction of zero gradients (through the communication
hook, if one is registered). When the counter reads 0 every rank has left; one of the last to leave (the highest
rank among them) then broadcasts its parameters and buffers, so every rank ends with the same model.

``divide_by_initial_world_size`` (torch's default True): the gradients are averaged over the whole world, the ranks
that left counting as zeros; False: over the ranks still training in that pass (without a communication hook; a hook
divides as it does). ``throw_on_early_termination``: instead of shadowing, the first rank to run out of data answers
one count and raises, and every rank still training raises in the forward that sees the count drop, as torch's:
each rank leaves with a RuntimeError the training loop can catch.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ...autograd.grad_mode import is_grad_enabled, no_grad
from ...tensor import Tensor


def _counters(ddp, values):
    device = next(iter(ddp.module.parameters())).device
    with device.context():
        flags = Tensor._make(device.array_module().asarray(np.array(values, np.int64)), device)
    ddp.process_group.all_reduce(flags, "sum")
    return [int(v) for v in flags.numpy()]


def notify(ddp):
    """A training rank's forward inside join(): count the ranks still training; set the reducer's divisor."""
    config = ddp._join_config
    active, _ = _counters(ddp, [1, int(is_grad_enabled() and ddp.require_sync)])
    if config["throw"] and active < ddp.process_group.size:
        raise RuntimeError(EARLY_TERMINATION)
    ddp.reducer.active_ranks = None if config["divide_by_initial_world_size"] else active


EARLY_TERMINATION = ("DistributedDataParallel.join: a rank ran out of inputs (throw_on_early_termination=True): "
                     "every rank raises here")


@contextlib.contextmanager
def join(ddp, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
    if not enable:
        yield
        return
    if ddp._join_config is not None:
        raise RuntimeError("DistributedDataParallel.join: already inside join() for this module")
    if not hasattr(ddp.reducer, "shadow_backward"):
        raise NotImplementedError("DistributedDataParallel.join: not supported with a zero_optimizer\n"
                                  "HINT: give every rank the same number of batches, or drop zero_optimizer")
    ddp._join_config = {"divide_by_initial_world_size": bool(divide_by_initial_world_size),
                        "throw": bool(throw_on_early_termination)}
    try:
        yield
        if throw_on_early_termination:
            if _counters(ddp, [0, 0])[0] > 0:  # answers the others' pending count; they raise there
                raise RuntimeError(EARLY_TERMINATION)
            return  # every rank ran out together: nothing to throw
        _shadow_until_all_joined(ddp)
    finally:
        ddp._join_config = None
        ddp.reducer.active_ranks = None


def _shadow_until_all_joined(ddp):
    first, last = True, False
    while True:
        active, syncing = _counters(ddp, [0, 0])
        if active == 0:
            last = first
            break
        first = False
        if ddp.broadcast_buffers:
            with no_grad():
                for b in ddp.module.buffers():
                    ddp.process_group.broadcast(b, 0)
        if syncing:
            ddp.reducer.active_ranks = None if ddp._join_config["divide_by_initial_world_size"] else active
            ddp.reducer.prepare_for_backward()
            ddp.reducer.shadow_backward()
    group = ddp.process_group
    source = Tensor(np.array([group.rank if last else -1], np.int64))
    group.all_reduce(source, "max")
    with no_grad():
        for t in list(ddp.module.parameters()) + list(ddp.module.buffers()):
            group.broadcast(t, int(source.numpy()[0]))


__all__ = ["join", "notify"]
