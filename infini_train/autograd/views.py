"""Differentiable views: how a view's history follows in-place changes to the memory it shares.

A view op (basic indexing, reshape/view, transpose, permute, expand, squeeze, split, ...) links its output
to its input with a ``ViewInfo`` (see function.py). Two graph nodes keep the gradients right when that
memory is written in place, as PyTorch's CopySlices and view regeneration do:

- ``CopySlices``: writing ``value`` into a view of ``base`` gives ``base`` a new history. The gradient of
  the old base is the incoming gradient with the view's region zeroed; ``value`` gets that region.
- ``ViewOf``: a view whose base changed since its history was recorded gets that history regenerated as
  "this region of the base's current value", so gradients reach what was written there.
"""
from __future__ import annotations

from .function import Op, ViewInfo
from .grad_mode import _state
from .ops.indexing import index_add


class ComposedView:
    """A chain of view makers, applied from the base outwards."""

    __slots__ = ("makers",)

    def __init__(self, makers):
        self.makers = makers

    def view_of(self, array):
        for maker in self.makers:
            array = maker.view_of(array)
        return array


def resolve(t):
    """The base tensor that ``t`` is (transitively) a view of, and the maker that rebuilds ``t`` from it."""
    makers = []
    while t._view is not None:
        makers.append(t._view.maker)
        t = t._view.parent
    makers.reverse()
    return t, (makers[0] if len(makers) == 1 else ComposedView(makers))


def _layout(array):
    """The order of ``array``'s dims from the largest stride to the smallest (None when C-contiguous)."""
    if array.flags.c_contiguous:
        return None
    strides = array.strides
    return tuple(sorted(range(array.ndim), key=lambda d: -strides[d]))


def _zeros_with_layout(xp, shape, dtype, order):
    """Zeros laid out like the base (same stride order), so the view chain applied to them aliases them."""
    if order is None:
        return xp.zeros(shape, dtype)
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return xp.zeros(tuple(shape[d] for d in order), dtype).transpose(inverse)


def _writable_region(xp, maker, grad):
    region = maker.view_of(grad)
    overlapping = any(s == 0 and n > 1 for s, n in zip(region.strides, region.shape))
    return None if overlapping or not xp.may_share_memory(region, grad) else region


def scatter_into_base(xp, maker, g, base_shape, order):
    """Zeros shaped like the base with ``g`` placed in the region ``maker`` selects (summed where the region
    repeats an element, as an expanded view does)."""
    grad = _zeros_with_layout(xp, base_shape, g.dtype, order)
    region = _writable_region(xp, maker, grad)
    if region is not None:
        region[...] = g
        return grad
    positions = maker.view_of(xp.arange(grad.size).reshape(grad.shape))
    flat = xp.zeros(grad.size, g.dtype)
    index_add(xp, flat, positions.reshape(-1), xp.broadcast_to(g, positions.shape).reshape(-1))
    return flat.reshape(grad.shape)


class ViewOf(Op):
    """``maker.view_of(base)`` as a graph node: the view's gradient lands in its region of the base."""

    is_view = True

    def __init__(self, maker):
        self.maker = maker

    def forward(self, base):
        self.order = _layout(base)
        return self.maker.view_of(base)

    def view_of(self, array):
        return self.maker.view_of(array)

    def backward(self, g):
        return scatter_into_base(self.xp, self.maker, g, self._input_shapes[0], self.order)

    def backward_graph(self, g):
        return ViewGrad(self.maker, self._input_shapes[0], self.order).apply(g)


class ViewGrad(Op):
    """The backward of a view as a recorded op (double backward): scatters into the view's region."""

    def __init__(self, maker, base_shape, order):
        self.maker = maker
        self.base_shape = base_shape
        self.order = order

    def forward(self, g):
        return scatter_into_base(self.xp, self.maker, g, self.base_shape, self.order)

    def backward(self, gg):
        return self.maker.view_of(gg)

    def backward_graph(self, gg):
        return ViewOf(self.maker).apply(gg)


class CopySlices(Op):
    """Write ``value`` into the view ``target`` (``maker.view_of(base)``, the region of the base's memory)."""

    def __init__(self, maker, target):
        self.maker = maker
        self.target = target

    def forward(self, base, value):
        self.order = _layout(base)
        self.xp.copyto(self.target, value)
        self.target = None  # the written region is the base's memory: nothing else to keep
        return base

    def backward(self, g):
        xp = self.xp
        need_base, need_value = self.needs_input_grad
        grad_value = self.maker.view_of(g) if need_value else None
        grad_base = None
        if need_base:
            grad_base = _zeros_with_layout(xp, g.shape, g.dtype, self.order)
            xp.copyto(grad_base, g)
            _writable_region(xp, self.maker, grad_base)[...] = 0
        return grad_base, grad_value

    def backward_graph(self, g):
        need_base, need_value = self.needs_input_grad
        grad_value = ViewOf(self.maker).apply(g) if need_value else None
        grad_base = None
        if need_base:
            # g with the region zeroed = g - scatter(region of g)
            grad_base = g - ViewGrad(self.maker, tuple(g.shape), self.order).apply(ViewOf(self.maker).apply(g))
        return grad_base, grad_value


def regenerate(t, root, maker):
    """Give the view ``t`` the history "region ``maker`` of ``root``'s current value"."""
    fresh = ViewOf(maker).apply(root)
    t.grad_fn, t._output_idx, t._requires_grad = fresh.grad_fn, 0, fresh._requires_grad
    t._view = ViewInfo(root, maker, t._version[0], True)


def refresh_view(t):
    """Called before ``t`` is used when its memory changed in place since its history was recorded."""
    info = t._view
    info.version = t._version[0]
    if not info.grad_mode or not _state.enabled:
        return
    root, maker = resolve(t)
    if root._requires_grad:
        regenerate(t, root, maker)
