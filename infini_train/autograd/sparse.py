"""embedding: rows of a weight table gathered by integer ids; backward scatter-adds into the table."""
from __future__ import annotations

from .function import Op, op_error
from .misc import index_add


class Embedding(Op):
    def __init__(self, padding_idx=None):
        self.padding_idx = padding_idx

    def forward(self, ids, weight):
        if ids.dtype.kind not in "iu":
            raise op_error("embedding", "integer ids", f"ids of dtype {ids.dtype}", "convert with .long()")
        if weight.ndim != 2:
            raise op_error("embedding", "a 2-D weight (num_embeddings, dim)", f"weight of shape {weight.shape}")
        vocab = weight.shape[0]
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= vocab:
                bad = lo if lo < 0 else hi
                raise op_error("embedding", f"ids in [0, {vocab})", f"id {bad}",
                               "the tokenizer's vocabulary must fit the model's vocab_size")
        self.ids = ids
        return self.xp.take(weight, ids, axis=0)

    def backward(self, g):
        xp = self.xp
        shape = self._input_shapes[1]
        grad = xp.zeros(shape, g.dtype)
        ids = self.ids.reshape(-1)
        index_add(xp, grad, ids, g.reshape(-1, shape[1]))
        if self.padding_idx is not None:
            grad[self.padding_idx] = 0
        return None, grad


def embedding(ids, weight, padding_idx=None):
    """weight[ids]; the row at ``padding_idx`` gets no gradient."""
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return Embedding(padding_idx).apply(ids, weight)


__all__ = ["embedding"]
