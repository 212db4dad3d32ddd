"""Which elements: nonzero / argwhere / count_nonzero and unique, as torch (no gradients: their outputs are
indices and counts; unique's values are not differentiable in torch either). Output shapes depend on the values,
so under lazy mode these run at once."""
from __future__ import annotations

import numbers

from ... import backend
from ...tensor import Tensor
from ..function import Op, op_error

__all__ = ["nonzero", "argwhere", "count_nonzero", "unique"]


class Nonzero(Op):
    """(number of nonzero elements, ndim) int64 indices, in row-major order; a 0-d input counts as 1-D."""

    differentiable = False

    def forward(self, x):
        xp = self.xp
        out = xp.stack(xp.nonzero(x.reshape(1) if x.ndim == 0 else x), axis=1).astype(backend.int64, copy=False)
        return out if x.ndim else out[:, :0]


def nonzero(x, *, as_tuple=False):
    """The indices of the nonzero elements: an (N, ndim) int64 tensor, or with ``as_tuple`` one 1-D tensor per dim
    (what ``x[x.nonzero(as_tuple=True)]`` indexes with)."""
    out = Nonzero().apply(x)
    if not as_tuple:
        return out
    if x.ndim == 0:
        return (Nonzero().apply(x.reshape(1))[:, 0].contiguous(),)
    return tuple(out[:, d].contiguous() for d in range(x.ndim))


def argwhere(x):
    """torch.argwhere: nonzero(x) as an (N, ndim) tensor."""
    return Nonzero().apply(x)


class CountNonzero(Op):
    differentiable = False

    def __init__(self, dims):
        self.dims = dims

    def forward(self, x):
        return self.xp.asarray((x != 0).sum(axis=self.dims), dtype=backend.int64)


def count_nonzero(x, dim=None):
    """The number of nonzero elements, over every dim or over ``dim`` (an int or tuple), as int64."""
    if dim is None:
        dims = None
    else:
        dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
        bound = max(x.ndim, 1)
        for d in dims:
            if not isinstance(d, numbers.Integral) or not -bound <= d < bound:
                raise op_error("count_nonzero", f"dims in [{-bound}, {bound - 1}]", f"dim={dim!r}")
        dims = tuple(sorted({int(d) % bound for d in dims})) if x.ndim else None
    return CountNonzero(dims).apply(x)


class Unique(Op):
    differentiable = False

    def __init__(self, dim):
        self.dim = dim

    def forward(self, x):
        xp = self.xp
        values, inverse, counts = xp.unique(x, return_inverse=True, return_counts=True, axis=self.dim)
        shape = x.shape if self.dim is None else (x.shape[self.dim],)
        return values, inverse.reshape(shape).astype(backend.int64), counts.astype(backend.int64)


def unique(x, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002 - torch's name
    """The distinct values of ``x`` in ascending order (``sorted`` is accepted as torch's; the values are sorted
    either way, as torch's CPU unique returns them); ``return_inverse`` adds where each element of ``x`` went,
    ``return_counts`` how often each value occurs. ``dim`` takes the distinct slices along that dim instead."""
    if not isinstance(x, Tensor):
        raise op_error("unique", "a Tensor", type(x).__name__)
    if dim is not None:
        if not isinstance(dim, numbers.Integral) or not -max(x.ndim, 1) <= dim < max(x.ndim, 1):
            raise op_error("unique", f"dim in [{-max(x.ndim, 1)}, {max(x.ndim, 1) - 1}] or None", f"dim={dim!r}")
        dim = int(dim) % max(x.ndim, 1)
    values, inverse, counts = Unique(dim).apply(x)
    if not (return_inverse or return_counts):
        return values
    return (values,) + ((inverse,) if return_inverse else ()) + ((counts,) if return_counts else ())
