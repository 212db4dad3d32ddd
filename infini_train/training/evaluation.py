"""Validation loss and text samples during a run, always in eval mode (dropout off) and without a graph; the
model goes back to the mode it was in afterwards."""
from __future__ import annotations

import contextlib

import numpy as np

from .. import backend
from .. import distributed as dist
from ..autograd.grad_mode import no_grad
from ..models.documents import DocumentLayout, packed_documents
from ..tensor import Tensor


@contextlib.contextmanager
def eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def to_device_tensor(array, device):
    return Tensor._make(backend.to_device_array(array, device), device)


def batch_on_device(batch, device):
    """(inputs, targets, context) of a loader's batch: the token Tensors on ``device`` and a zero-argument
    callable giving the context its forwards run under -- the layout of packed documents for an SFT batch (with
    ``positions`` and ``segments``), else a no-op."""
    x, y = to_device_tensor(batch[0], device), to_device_tensor(batch[1], device)
    if getattr(batch, "segments", None) is None:
        return x, y, contextlib.nullcontext
    layout = DocumentLayout(batch.positions, batch.segments)
    return x, y, lambda: packed_documents(layout)


@no_grad()
def evaluate(model, loader, steps, device, amp=None, group=None):
    """The validation loss over the first ``steps`` batches of ``loader``'s batch size (``steps * B`` sequences from
    its start), the same sequences and the same figure whatever the data-parallel size: the loader's ``world_size``
    ranks (``group``, default the world) share the batches -- rank r takes batches r, r + world_size, ... -- and each
    runs as many forwards (an all-gathering layout needs every rank in each), the last ones past ``steps`` unused.
    The batch losses are combined in batch order as token_weighted_mean does. The forward runs under ``amp()`` when
    given (the run's autocast)."""
    loader.reset()
    ranks, rank = loader.world_size, loader.rank
    per_rank = -(-steps // ranks)
    losses_and_tokens = np.zeros((2, per_rank * ranks), np.float64)  # each batch's slot filled by its rank alone
    with eval_mode(model), amp() if amp is not None else contextlib.nullcontext():
        for j in range(per_rank):
            batch = loader.next_batch()
            x, y, context = batch_on_device(batch, device)
            with context():
                _, loss = model(x, y)
            losses_and_tokens[:, j * ranks + rank] = loss.item(), trained_tokens(batch)
    if ranks > 1:
        summed = to_device_tensor(losses_and_tokens, device)
        dist.all_reduce(summed, "sum", group=group)
        losses_and_tokens = np.asarray(backend.to_device_array(summed.array, backend.CPU))
    losses, tokens = losses_and_tokens[:, :steps]
    return token_weighted_mean(losses, tokens)


def trained_tokens(batch):
    """The targets of a loader's batch that count in the loss (not -1)."""
    return int((np.asarray(batch[1]) != -1).sum())


def token_weighted_mean(losses, tokens):
    """The mean loss per trained token from each batch's mean loss and trained-token count: the plain mean of the
    batch losses when every batch trains as many tokens (token batches: as one process computed it always)."""
    losses, tokens = np.ascontiguousarray(losses, np.float64), np.asarray(tokens, np.float64)
    if (tokens == tokens[0]).all():
        return float(np.mean(losses))
    return float(np.dot(losses, tokens) / tokens.sum())


@no_grad()
def sample_text(model, tokenizer, length, seed, device, amp=None):
    """``length`` tokens generated after the end-of-text token (top-k 40), decoded."""
    start = Tensor(np.array([[tokenizer.eot_token]], np.int64), device=device)
    with eval_mode(model), amp() if amp is not None else contextlib.nullcontext():
        out = model.generate(start, length, temperature=1.0, top_k=40, seed=seed)
    return tokenizer.decode(out.numpy()[0, 1:].tolist())
