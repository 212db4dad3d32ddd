"""Reordering along dims, as torch: flip, fliplr, flipud, roll, rot90, unbind and diff. Each is built from
indexing (reversed slices, one position) and cat, whose backward (and double backward) are those ops' own."""
from __future__ import annotations

import numbers

from ...tensor import Tensor
from ..function import op_error
from .joins import cat

__all__ = ["flip", "fliplr", "flipud", "roll", "rot90", "unbind", "diff"]


def _dim(op, dim, ndim):
    if not isinstance(dim, numbers.Integral) or isinstance(dim, bool) or not -max(ndim, 1) <= dim < max(ndim, 1):
        raise op_error(op, f"dim in [{-max(ndim, 1)}, {max(ndim, 1) - 1}]", f"dim={dim!r}",
                       "negative dims count from the end")
    return int(dim) % max(ndim, 1)


def _dims(op, dims, ndim):
    dims = (dims,) if isinstance(dims, numbers.Integral) else tuple(dims)
    out = tuple(_dim(op, d, ndim) for d in dims)
    if len(set(out)) != len(out):
        raise op_error(op, "distinct dims", f"dims={dims!r}", "name each dim once")
    return out


def _along(dim, item):
    """An index that applies ``item`` to ``dim`` and keeps the dims before it whole."""
    return (slice(None),) * dim + (item,)


def flip(x, dims):
    """A copy of ``x`` with the order of elements along ``dims`` reversed (torch.flip)."""
    dims = _dims("flip", dims, x.ndim)
    if x.ndim == 0 or not dims:
        return x.clone()
    return x[tuple(slice(None, None, -1) if d in dims else slice(None) for d in range(x.ndim))].clone()


def fliplr(x):
    """Columns reversed (dim 1); ``x`` must have at least 2 dims."""
    if x.ndim < 2:
        raise op_error("fliplr", "a tensor of at least 2 dims", f"{x.ndim} dims", "use flip(x, 0) for 1-D tensors")
    return flip(x, (1,))


def flipud(x):
    """Rows reversed (dim 0); ``x`` must have at least 1 dim."""
    if x.ndim < 1:
        raise op_error("flipud", "a tensor of at least 1 dim", "a 0-d tensor", "a 0-d tensor has no rows to reverse")
    return flip(x, (0,))


def roll(x, shifts, dims=None):
    """Elements shifted along ``dims`` by ``shifts`` (ints or tuples of the same length), wrapping around; without
    ``dims`` the flattened tensor is rolled and the shape restored (torch.roll)."""
    shifts = (shifts,) if isinstance(shifts, numbers.Integral) else tuple(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise op_error("roll", "one shift when dims is None (the flattened tensor rolls)",
                           f"shifts={shifts!r}", "pass dims, one per shift")
        return roll(x.reshape(-1), shifts, 0).reshape(x.shape)
    dims = (dims,) if isinstance(dims, numbers.Integral) else tuple(dims)
    if len(shifts) != len(dims):
        raise op_error("roll", "as many shifts as dims", f"shifts={shifts!r}, dims={dims!r}",
                       "pass one shift per dim, e.g. roll(x, (1, 2), (0, 1))")
    out = x
    for shift, dim in zip(shifts, dims):
        dim = _dim("roll", dim, x.ndim)
        n = x.shape[dim] if x.ndim else 1
        s = int(shift) % n if n else 0
        if s:
            out = cat([out[_along(dim, slice(n - s, None))], out[_along(dim, slice(0, n - s))]], dim)
    return out if out is not x else x.clone()


def rot90(x, k=1, dims=(0, 1)):
    """``x`` rotated by 90 degrees ``k`` times in the plane of ``dims``, from the first dim towards the second
    (torch.rot90)."""
    dims = tuple(dims)
    if len(dims) != 2:
        raise op_error("rot90", "two dims (the plane of rotation)", f"dims={dims!r}", "e.g. dims=(0, 1)")
    if x.ndim < 2:
        raise op_error("rot90", "a tensor of at least 2 dims", f"{x.ndim} dims", "use flip(x, 0) for a 1-D tensor")
    d0, d1 = _dims("rot90", dims, x.ndim)
    k = int(k) % 4
    if k == 1:
        return flip(x, (d1,)).transpose(d0, d1)
    if k == 2:
        return flip(x, (d0, d1))
    if k == 3:
        return flip(x, (d0,)).transpose(d0, d1)
    return x.clone()


def unbind(x, dim=0):
    """The slices of ``x`` along ``dim``, as a tuple of views (torch.unbind)."""
    if x.ndim == 0:
        raise op_error("unbind", "a tensor of at least 1 dim", "a 0-d tensor", "a 0-d tensor has no dim to split")
    dim = _dim("unbind", dim, x.ndim)
    return tuple(x[_along(dim, i)] for i in range(x.shape[dim]))


def diff(x, n=1, dim=-1, prepend=None, append=None):
    """The ``n``-th forward difference along ``dim`` (out[i] = x[i + 1] - x[i]), after joining ``prepend`` and
    ``append`` along it (torch.diff); bool tensors differ by logical xor."""
    if x.ndim == 0:
        raise op_error("diff", "a tensor of at least 1 dim", "a 0-d tensor", "reshape it to (1,) first")
    if not isinstance(n, numbers.Integral) or n < 0:
        raise op_error("diff", "an order n >= 0", f"n={n!r}", "n counts how many times the difference is taken")
    dim = _dim("diff", dim, x.ndim)
    parts = [p for p in (prepend, x, append) if p is not None]
    for p in parts:
        if not isinstance(p, Tensor):
            raise op_error("diff", "prepend / append as tensors", f"{type(p).__name__}",
                           "wrap the values with it.tensor(...), shaped as the input except along dim")
    if len(parts) > 1:
        x = cat(parts, dim)
    for _ in range(int(n)):
        length = x.shape[dim]
        if length == 0:
            break
        later, earlier = x[_along(dim, slice(1, None))], x[_along(dim, slice(0, length - 1))]
        x = later.logical_xor(earlier) if x.dtype == bool else later - earlier
    return x
