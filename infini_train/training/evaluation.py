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
def evaluate(model, loader, steps, device, amp=None):
    """Mean loss over ``steps`` batches from the start of ``loader``, averaged over the ranks; the forward runs
    under ``amp()`` when given (the run's autocast)."""
    loader.reset()
    losses = []
    with eval_mode(model), amp() if amp is not None else contextlib.nullcontext():
        for _ in range(steps):
            x, y, context = batch_on_device(loader.next_batch(), device)
            with context():
                _, loss = model(x, y)
            losses.append(loss.item())
    mean = to_device_tensor(np.array([float(np.mean(losses))], np.float64), device)
    dist.all_reduce(mean, "avg")
    return float(mean.numpy()[0])


@no_grad()
def sample_text(model, tokenizer, length, seed, device, amp=None):
    """``length`` tokens generated after the end-of-text token (top-k 40), decoded."""
    start = Tensor(np.array([[tokenizer.eot_token]], np.int64), device=device)
    with eval_mode(model), amp() if amp is not None else contextlib.nullcontext():
        out = model.generate(start, length, temperature=1.0, top_k=40, seed=seed)
    return tokenizer.decode(out.numpy()[0, 1:].tolist())
