"""torch's built-in DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks.default_hooks).

``state`` is the process group to reduce over (None: the world). Each hook divides the bucket by the group's size and
all-reduces it (a sum), returning a Future of the averaged flat gradient:

- ``allreduce_hook``: in the bucket's dtype (what DDP does without a hook).
- ``fp16_compress_hook`` / ``bf16_compress_hook``: cast to float16 / bfloat16 first (half the bytes on the wire), divide
  there, all-reduce, and cast the result back into the bucket's dtype.
"""
from __future__ import annotations

import numpy as np

from .... import backend
from ...futures import Future
from ....tensor import Tensor


def _group(state):
    if state is None:
        from ... import default_group

        return default_group()
    if not hasattr(state, "all_reduce"):
        raise TypeError(f"DDP comm hook: expected state to be a process group or None, got {type(state).__name__}\n"
                        "HINT: ddp.register_comm_hook(None, allreduce_hook) reduces over the world")
    return state


def allreduce_hook(state, bucket):
    group = _group(state)
    flat = bucket.buffer()
    flat.array[...] /= group.size
    work = group.all_reduce(flat, "sum", async_op=True)
    return Future(work, value=flat)


def _compress_hook(state, bucket, dtype):
    group = _group(state)
    flat = bucket.buffer()
    with flat.device.context():
        compressed = Tensor._make(flat.array.astype(dtype), flat.device)
    compressed.array[...] /= group.size
    work = group.all_reduce(compressed, "sum", async_op=True)

    def decompress():
        flat.array[...] = compressed.array
        return flat

    return Future(work, produce=decompress)


def fp16_compress_hook(state, bucket):
    return _compress_hook(state, bucket, np.float16)


def bf16_compress_hook(state, bucket):
    if backend.bfloat16 is None:
        raise RuntimeError("bf16_compress_hook: bfloat16 needs the ml_dtypes package\nHINT: pip install ml_dtypes")
    return _compress_hook(state, bucket, backend.bfloat16)


__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]
