"""pad: torch.nn.functional.pad's constant, reflect, replicate and circular padding.

``pad`` is a flat tuple of (left, right) pairs starting from the last dim. Negative pads crop. The three
non-constant modes pad the last 1, 2 or 3 dims of a (N, C, *) or (C, *) input, as in torch; they read the
input through one index array per padded dim, and backward sends each output position's gradient back to
the input position it read.

Exposed as ``infini_train.nn.functional.pad`` (torch has no top-level ``torch.pad``), so nothing is listed
in ``__all__`` here.
"""
from __future__ import annotations

import numbers

from ..double_backward import LinearAdjoint
from ..function import Op, op_error

__all__ = []

MODES = ("constant", "reflect", "replicate", "circular")


def _pairs(pad, ndim):
    """The (dim, left, right) of every padded dim; ``pad`` starts from the last dim."""
    return [(ndim - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]


def _check_pad(pad, ndim, mode, value):
    if not isinstance(pad, (tuple, list)) or not all(
            isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in pad):
        raise op_error("pad", "pad as a tuple of ints", repr(pad), "e.g. pad=(1, 1) pads the last dim by 1 each side")
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise op_error("pad", "a padding length divisible by 2", f"{len(pad)} values",
                       "give one (left, right) pair per padded dim, starting from the last dim")
    if len(pad) > 2 * ndim:
        raise op_error("pad", f"at most {2 * ndim} padding values (two per dim) for a {ndim}-D input",
                       f"{len(pad)} values")
    if mode not in MODES:
        raise op_error("pad", f"mode in {MODES}", repr(mode))
    if mode != "constant" and value != 0:
        raise op_error("pad", f"no fill value for mode {mode!r}", f"value={value!r}",
                       "value is only used by mode='constant'")
    return pad


def _check_shape(shape, pairs, mode):
    """torch's limits: which inputs each mode takes and how far it may pad or crop."""
    ndim, padded = len(shape), len(pairs)
    if mode != "constant" and (padded not in (1, 2, 3) or ndim not in (padded + 1, padded + 2)):
        raise op_error("pad", f"a {padded + 1}-D or {padded + 2}-D input for {2 * padded} padding values in mode "
                       f"{mode!r}", f"a {ndim}-D input of shape {shape}",
                       "reflect, replicate and circular pad the last 1, 2 or 3 dims of a (N, C, *) or (C, *) "
                       "input; use mode='constant' for other layouts")
    if mode in ("reflect", "replicate") and 0 in shape[ndim - padded - 1:]:
        raise op_error("pad", f"non-zero sizes in every dim but the batch dim for mode {mode!r}", f"shape {shape}")
    for dim, left, right in pairs:
        n = shape[dim]
        if mode == "reflect" and (left >= n or right >= n):
            raise op_error("pad", f"reflect padding smaller than the size of dim {dim} ({n})",
                           f"padding ({left}, {right}) for shape {shape}",
                           "reflection cannot reach past the far edge; use mode='replicate' or 'constant'")
        cropped = n + min(left, 0) + min(right, 0)
        if mode == "constant" and cropped < 0:
            raise op_error("pad", f"negative pads that crop at most the size of dim {dim} ({n})",
                           f"padding ({left}, {right}) for shape {shape}")
        if mode == "circular" and (left > cropped or right > cropped):
            # torch checks against the uncropped size, and past the cropped one it reads unset memory
            raise op_error("pad", f"circular padding of at most the size of dim {dim} ({cropped} after cropping)",
                           f"padding ({left}, {right}) for shape {shape}", "circular padding wraps around at most once")
        least = 0 if mode in ("constant", "circular") else 1
        if n + left + right < least:
            raise op_error("pad", f"an output size of at least {least} in dim {dim}",
                           f"{n + left + right} from size {n} with padding ({left}, {right})",
                           "negative pads crop; crop less")


def _source_index(xp, mode, n, left, right):
    """For each output position along one padded dim, the input position it reads."""
    s = xp.arange(-left, n + right)  # the position each output would read in an unpadded input
    if mode == "reflect":  # mirror about the edge elements, which are not repeated
        return xp.where(s < 0, -s, xp.where(s >= n, 2 * (n - 1) - s, s))
    if mode == "replicate":
        return xp.clip(s, 0, n - 1)
    # circular: crop first, then wrap around what is left (as torch does)
    start = max(-left, 0)
    cropped = n + min(left, 0) + min(right, 0)
    return start + (xp.arange(-max(left, 0), cropped + max(right, 0)) % max(cropped, 1))


class Pad(Op):
    def __init__(self, pad, mode, value):
        self.pad, self.mode, self.value = pad, mode, value

    def forward(self, x):
        self.pad = _check_pad(self.pad, x.ndim, self.mode, self.value)
        pairs = self.pairs = _pairs(self.pad, x.ndim)
        _check_shape(x.shape, pairs, self.mode)
        xp = self.xp
        if self.mode == "constant":
            shape = list(x.shape)
            for dim, left, right in pairs:
                shape[dim] += left + right
            out = xp.full(tuple(shape), self.value, dtype=x.dtype)
            inner, outer = self._constant_regions(x.shape)
            out[outer] = x[inner]
            return out
        self.sources = []
        for dim, left, right in pairs:
            source = _source_index(xp, self.mode, x.shape[dim], left, right)
            self.sources.append(source)
            x = xp.take(x, source, axis=dim)
        return x

    def _constant_regions(self, shape):
        """Slices of the input that survive cropping, and where they land in the output."""
        inner = [slice(None)] * len(shape)
        outer = [slice(None)] * len(shape)
        for dim, left, right in self.pairs:
            n = shape[dim]
            inner[dim] = slice(max(-left, 0), n - max(-right, 0))
            outer[dim] = slice(max(left, 0), max(left, 0) + max(n + min(left, 0) + min(right, 0), 0))
        return tuple(inner), tuple(outer)

    def backward(self, g):
        xp = self.xp
        if self.mode == "constant":
            grad = xp.zeros(self._input_shapes[0], g.dtype)
            inner, outer = self._constant_regions(grad.shape)
            grad[inner] = g[outer]
            return grad
        shape = list(self._input_shapes[0])
        for (dim, left, right), source in reversed(list(zip(self.pairs, self.sources))):
            g = self._unpad_dim(g, dim, shape[dim], left, right, source)
        return g

    def backward_graph(self, g):
        """The gradient is linear in g: the same map as an op, whose own backward pads again (with zeros)."""
        return LinearAdjoint(self.backward, Pad(self.pad, self.mode, 0.0).apply).apply(g)

    def _unpad_dim(self, g, dim, n, left, right, source):
        """Sum the gradient of one padded dim back onto the positions read. The output splits into a left
        pad, the copied middle and a right pad; inside each part no input position is read twice (torch's size
        limits see to that), except replicate's pads, which read one edge element over and over."""
        xp = self.xp
        shape = list(g.shape)
        shape[dim] = n
        grad = xp.zeros(tuple(shape), g.dtype)
        out = g.shape[dim]
        lo = min(max(left, 0), out)  # outputs [lo, hi) read the input in order, starting at max(-left, 0)
        hi = min(max(left + n, lo), out)

        def along(index):
            return (slice(None),) * dim + (index,)

        first = max(-left, 0)
        grad[along(slice(first, first + hi - lo))] += g[along(slice(lo, hi))]
        for part, edge in ((slice(0, lo), 0), (slice(hi, out), n - 1)):
            if part.stop <= part.start:
                continue
            if self.mode == "replicate":
                grad[along(slice(edge, edge + 1))] += g[along(part)].sum(axis=dim, keepdims=True)
            else:
                grad[along(source[part])] += g[along(part)]
        return grad


def pad(x, pad, mode="constant", value=0.0):
    """Pad ``x`` as torch.nn.functional.pad: ``pad`` = (left, right) pairs from the last dim backwards.

    mode 'constant' fills with ``value`` on any dims (negative pads crop); 'reflect' mirrors about the edge,
    'replicate' repeats the edge, 'circular' wraps around; these three pad the last 1, 2 or 3 dims of a
    (N, C, *) or (C, *) input, with torch's size limits.
    """
    return Pad(pad, mode, value).apply(x)
