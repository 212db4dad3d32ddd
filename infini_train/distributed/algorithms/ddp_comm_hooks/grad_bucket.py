"""GradBucket: what a DDP communication hook receives, as torch's: ``buffer()`` the bucket's flat gradient (a Tensor
that the hook may change in place), ``gradients()`` its parameters' gradients as views of it, ``parameters()``,
``index()`` (0 for the first bucket reduced) and ``is_last()``."""
from __future__ import annotations

from ....tensor import Tensor


class GradBucket:
    def __init__(self, index, flat, params, offsets, last):
        self._index, self._flat, self._params, self._offsets, self._last = index, flat, params, offsets, last

    def index(self):
        return self._index

    def buffer(self):
        return self._flat

    def gradients(self):
        flat = self._flat.array
        return [Tensor._make(flat[off:off + p.numel()].reshape(p.shape), self._flat.device)
                for p, off in zip(self._params, self._offsets)]

    def parameters(self):
        return list(self._params)

    def is_last(self):
        return self._last

    def __repr__(self):
        return f"GradBucket(index={self._index}, {len(self._params)} parameters, {self._flat.numel()} elements)"


__all__ = ["GradBucket"]
