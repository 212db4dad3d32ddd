"""Shape transforms: reshape/view, transpose, permute, expand, (un)squeeze, flatten, tril/triu,
masked_fill, repeat_interleave, contiguous."""
from __future__ import annotations

from .function import Op

__all__ = ["reshape", "view", "transpose"]


class Reshape(Op):
    is_view = True

    def __init__(self, shape):
        self.shape = shape

    def forward(self, a):
        return a.reshape(self.shape)

    def backward(self, g):
        return g.reshape(self._input_shapes[0])


class Transpose(Op):
    is_view = True

    def __init__(self, dim0, dim1):
        self.dim0 = dim0
        self.dim1 = dim1

    def forward(self, a):
        return self.xp.swapaxes(a, self.dim0, self.dim1)

    def backward(self, g):
        return self.xp.swapaxes(g, self.dim0, self.dim1)


def reshape(x, shape):
    """Same data, new shape (one dim may be -1). A view where the memory layout allows."""
    return Reshape(tuple(shape)).apply(x)


view = reshape


def transpose(x, dim0, dim1):
    """Swap two dimensions (a view)."""
    return Transpose(dim0, dim1).apply(x)
