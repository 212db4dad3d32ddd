"""A language model's loss over the trained tokens of a batch (targets other than -1): their mean cross-entropy, or,
inside ``loss_over_tokens(count)``, the sum of their cross-entropies divided by ``count``.

A run whose targets are masked (fine-tuning: prompts, padding) gives every micro-batch of a step the same ``count``:
the trained tokens of the whole global batch over the micro-batches that share it (grad_accum x data-parallel ranks),
so the step's objective is the mean over every trained token of the global batch however it is split into
micro-batches and ranks (transformers' ``num_items_in_batch``). Outside the context the loss is the mean over the
batch's own tokens, as ``F.cross_entropy(..., ignore_index=-1)``.

    with loss_over_tokens(trained_tokens_of_global_batch / (grad_accum * data_parallel_size)):
        _, loss = model(x, y)   # sum over this micro-batch's trained tokens / count
"""
from __future__ import annotations

import contextlib
import threading

from ..nn import functional as F


class _State(threading.local):
    count = None


_state = _State()


@contextlib.contextmanager
def loss_over_tokens(count):
    """Forwards inside divide their summed token losses by ``count`` (a number > 0) instead of taking the mean."""
    if not count > 0:
        raise ValueError(f"loss_over_tokens: expected a token count > 0, got {count!r}")
    previous, _state.count = _state.count, float(count)
    try:
        yield
    finally:
        _state.count = previous


def tokens_counted():
    """The count the loss divides by inside ``loss_over_tokens``, or None (the mean over the batch's own tokens)."""
    return _state.count


def token_loss(logits, targets):
    """The loss of (N, V) logits against (N,) targets, -1 ignored (see the module docstring)."""
    count = _state.count
    if count is None:
        return F.cross_entropy(logits, targets, ignore_index=-1)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum") / count


__all__ = ["loss_over_tokens", "tokens_counted", "token_loss"]
