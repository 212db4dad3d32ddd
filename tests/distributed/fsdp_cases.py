"""A small GPT-2 trained by fully_shard and by plain AdamW on one process, step by step: shared by the in-process
tests (a world of one) and the mpiexec workers."""
import numpy as np

import infini_train as it
from infini_train.distributed.fsdp import fully_shard
from infini_train.models.gpt2 import GPT2, GPT2Config

CONFIG = GPT2Config(block_size=16, vocab_size=64, n_layer=3, n_head=2, n_embd=32)
LR = 1e-3


def build(seed=0, config=CONFIG):
    it.manual_seed(seed)
    return GPT2(config)


def sharded(model, group=None, **options):
    for block in model.transformer.h:
        fully_shard(block, group, **options)
    return fully_shard(model, group, **options)


def batches(steps, batch=6, seed=1, vocab=64, length=16):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, (batch, length)), rng.integers(0, vocab, (batch, length))) for _ in range(steps)]


def reference_steps(model, data, lr=LR, clip=0.5):
    """(losses, grad norms) of plain AdamW with clipping over the whole batches."""
    opt = it.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    losses, norms = [], []
    for x, y in data:
        _, loss = model(it.tensor(x), it.tensor(y))
        loss.backward()
        norms.append(float(it.nn.utils.clip_grad_norm_(model.parameters(), clip).item()))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms


def sharded_steps(model, data, rank, world, lr=LR, clip=0.5, reduce_loss=None):
    """The same with ``model`` fully sharded: this rank runs its slice of each batch."""
    opt = it.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    losses, norms = [], []
    for x, y in data:
        lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
        _, loss = model(it.tensor(x[lo:hi]), it.tensor(y[lo:hi]))
        loss.backward()
        norms.append(float(model.clip_grad_norm_(clip).item()))
        opt.step()
        opt.zero_grad()
        value = loss.item()
        losses.append(reduce_loss(value) if reduce_loss else value)
    return losses, norms
