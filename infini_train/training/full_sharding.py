"""ZeRO-3 in a run (``parallel.zero_stage: 3``): fully_shard over the data-parallel group, each transformer block a
unit and each root (the model, or each pipeline chunk) one for what is left (embeddings, final norm, output layer),
as torchtitan applies FSDP2. Applied to the model still on the meta device, so each rank allocates only its shards.

A pipeline's tied embedding and its last-stage copy are units of their own (the embedding module on the first
stage, the output layer on the last): their shards cover the same elements on both stages, so summing their
gradient shards over the embedding group sums the copies'."""
from __future__ import annotations

import contextlib

from ..distributed.fsdp import FSDPModule, fully_shard


def shard_fully(model, dims):
    """fully_shard ``model`` (a causal LM or a PipelinedLM) block by block over ``dims.grad_group`` (data x
    context); returns it."""
    roots = list(model.chunks) if dims.pipeline_parallel else [model]
    shared = {id(p) for p in model.shared_embedding_params()} if dims.pipeline_parallel else set()
    for root in roots:
        for module in root.modules():
            if any(id(p) in shared for p in module._parameters.values() if p is not None):
                fully_shard(module, dims.grad_group)
        for _, block in root.numbered_blocks():
            fully_shard(block, dims.grad_group)
        fully_shard(root, dims.grad_group)
    return model


@contextlib.contextmanager
def gathered(model, writeback=False, trainable_only=False):
    """Under ZeRO-3, ``model``'s parameters gathered whole on every rank while the block runs (collective): for
    writing and reading checkpoints of the whole format and exporting adapters; otherwise nothing."""
    roots = [m for m in (getattr(model, "chunks", None) or [model]) if isinstance(m, FSDPModule)]
    with contextlib.ExitStack() as stack:
        for root in roots:
            stack.enter_context(root.unsharded(writeback, trainable_only))
        yield model


__all__ = ["shard_fully", "gathered"]
