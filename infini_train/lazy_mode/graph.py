"""Lazy graph: recorded nodes, the placeholder tensors they hand out, and realisation.

Under ``with it.lazy():`` ``Function.apply`` calls ``record``: the op becomes a ``LazyNode`` (the Function, its
inputs, the grad mode of the moment) and the caller gets a ``LazyTensor`` placeholder. A ``LazyTensor`` is a
``Tensor`` whose array and autograd slots are not set yet: reading any of them (``.numpy()``, ``.item()``,
``repr``, ``backward``, eager code touching ``.array``) realises it, i.e. computes exactly the nodes it depends
on, in topological order, by a loop. Each node then runs through the eager ``Function.apply`` path under its
recorded grad mode, so values, ``grad_fn``, saved tensors and views are what eager mode gives, and the
placeholder becomes that very Tensor (its slots filled, its class switched to ``Tensor``).

What is recorded, and what runs at once:
- recorded: the single-output element-wise Ops (``fusion.ELEMENTWISE``: their shape and dtype are inferred at
  record time, from the broadcast shape and a forward on 1-element stand-ins, so ``.shape``/``.dtype`` do not
  realise) and a few single-output Ops (``DEFERRED``: matmul, linear, sum, mean, shape ops; asking for their
  shape or dtype realises them);
- run at once (lazy inputs realised first): every other Function (custom Functions, multi-output ops, ops that
  draw random numbers such as dropout, which must keep eager mode's RNG order, device moves and collectives,
  which must keep their order across processes), and everything while autocast is on.

Nodes hold their producers (not the producers' placeholders) and weak references to their placeholders and
consumers: a result nobody references anymore is never computed, unless a referenced one needs it. Writing into
a tensor through the tensor API (in-place ops, ``copy_``, ``t[i] = v``, ``t.data = ...``) first realises the
pending nodes that read its memory (same version counter, directly or through lazy views of it), so they see
the old values as in eager mode. Writes that bypass the tensor API (optimizer steps, writes through
``.numpy()``) do not: call ``it.lazy.realize_all()`` (or leave the block) before them.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from ..autograd.function import eager_apply
from ..autograd.grad_mode import _state as _grad
from ..tensor import Tensor
from . import fusion
from .mode import live_pending, suspended, take_pending, track

_lock = threading.RLock()  # one realisation at a time (a placeholder may be realised from another thread)
_AUTOGRAD_SLOTS = ("array", "_requires_grad", "grad_fn", "_output_idx", "_version", "_accumulate", "_view")


class _In:
    """An input that is output ``idx`` of a lazy ``node`` (the node, not the placeholder, is held)."""

    __slots__ = ("node", "idx")

    def __init__(self, node, idx):
        self.node = node
        self.idx = idx

    def value(self):
        return self.node.results[self.idx]


class LazyNode:
    """A recorded op: ``fn`` applied to ``inputs`` (``_In`` for lazy producers) under ``grad_mode``."""

    __slots__ = ("fn", "inputs", "device", "grad_mode", "meta", "record", "outputs", "results", "done", "consumers",
                 "__weakref__")

    def __init__(self, fn, inputs, device, grad_mode, meta, record):
        self.fn = fn
        self.device = device
        self.inputs = inputs
        self.grad_mode = grad_mode
        self.meta = meta  # ((shape, dtype),) when inferred, else None
        self.record = record  # whether the op records a graph node: True / False / None (not known yet)
        self.outputs = ()  # weak references to the placeholders
        self.results = None  # the realised Tensors
        self.done = False
        self.consumers = []  # weak references to nodes reading this one

    def output_requires_grad(self, idx):
        if self.record is False:
            return False
        if self.record is None or self.meta is None:
            return None
        return self.meta[idx][1].kind in "fV"


class LazyTensor(Tensor):
    """A Tensor whose value is not computed yet. Only ``device``, ``grad`` and ``_lazy`` are set; touching any
    other slot realises it (``__getattr__`` runs only for unset slots), after which it is a plain Tensor."""

    __slots__ = ()

    def __getattr__(self, name):
        if name in _AUTOGRAD_SLOTS:
            realize(self)
            if self.__class__ is LazyTensor:
                raise RuntimeError(f"lazy: realising a tensor left its '{name}' unset (an internal error)")
            return getattr(self, name)
        raise AttributeError(f"'Tensor' object has no attribute '{name}'")

    def _meta(self):
        node, idx = self._lazy
        return None if node.meta is None else node.meta[idx]

    @property
    def shape(self):
        meta = self._meta()
        return self.array.shape if meta is None else meta[0]

    @property
    def dtype(self):
        meta = self._meta()
        return self.array.dtype if meta is None else meta[1]

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    def numel(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def size(self, dim=None):
        shape = self.shape
        return shape if dim is None else shape[dim]

    def element_size(self):
        return self.dtype.itemsize


def _placeholder(node, idx, device, requires_grad):
    t = object.__new__(LazyTensor)
    t.device = device
    t.grad = None
    t._lazy = (node, idx)
    if requires_grad is not None:
        t._requires_grad = requires_grad
    return t


def _adopt(placeholder, real):
    """Turn ``placeholder`` into the realised Tensor ``real`` (same object the user holds)."""
    for name in _AUTOGRAD_SLOTS:
        setattr(placeholder, name, getattr(real, name))
    placeholder.__class__ = Tensor
    del placeholder._lazy
    return placeholder


# ------------------------------------------------------------------------------------------- recording
DEFERRED = set()  # single-output Ops recorded without shape inference (filled in below)


def _register_deferred():
    from ..autograd.ops import conversion, matmul, reduction, transform
    from ..autograd.ops.linear import Linear
    DEFERRED.update({matmul.Matmul, Linear, reduction.Sum, reduction.Mean, transform.Transpose,
                     transform.Permute, transform.Contiguous, conversion.Clone})


def _recordable(fn):
    cls = type(fn)
    if not fn._arrays or fn.cross_device or fn.output_devices is not None:
        return False
    if cls in fusion.ELEMENTWISE or cls in DEFERRED:
        from ..autograd.autocast import _state as autocast
        return not autocast.active
    return False


def run_now(fn, inputs):
    """The eager path for an op lazy mode does not record: lazy inputs realised, then applied eagerly."""
    realize(*[t for t in inputs if t.__class__ is LazyTensor])
    with suspended():
        return eager_apply(fn, inputs)


def record(fn, inputs):
    """``fn.apply(*inputs)`` in lazy mode: a LazyNode and its placeholder (or the eager result, see above)."""
    if not DEFERRED:
        _register_deferred()
    if not _recordable(fn):
        return run_now(fn, inputs)
    grad_on = _grad.enabled
    dev = None
    args = []
    requires = False  # whether any input requires grad: True / False / None (unknown)
    for t in inputs:
        if t.__class__ is LazyTensor:
            node, idx = t._lazy
            args.append(_In(node, idx))
            rg = node.output_requires_grad(idx)
        elif isinstance(t, Tensor):
            view = t._view
            if view is not None and view.version != t._version[0] and grad_on:
                from ..autograd.views import refresh_view
                refresh_view(t)  # as eager mode does at this moment
            args.append(t)
            rg = t._requires_grad
        else:
            args.append(t)
            continue
        if dev is None:
            dev = t.device
        elif t.device is not dev:
            return run_now(fn, inputs)  # raises eager mode's error
        if rg is None:
            requires = None if requires is False else requires
        elif rg:
            requires = True
    if dev is None:
        return run_now(fn, inputs)  # no tensor at all: nothing to defer
    record_graph = False if not (grad_on and fn.differentiable) else requires
    meta = None
    if type(fn) in fusion.ELEMENTWISE:
        meta = fusion.infer_meta(fn, inputs)
        if meta is None:
            return run_now(fn, inputs)  # a shape or dtype error: raise it where eager mode does
    node = LazyNode(fn, tuple(args), dev, grad_on, meta, record_graph)
    for a in args:
        if a.__class__ is _In:
            a.node.consumers.append(weakref.ref(node))
    rg = node.output_requires_grad(0)
    out = _placeholder(node, 0, dev, rg)
    node.outputs = (weakref.ref(out),)
    track(node)
    return out


# ------------------------------------------------------------------------------------------ realisation
def _needed(targets):
    """The pending nodes ``targets`` depend on, producers first (an iterative depth-first walk)."""
    order = []
    seen = set()
    for root in targets:
        if root.done or id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root.inputs))]
        while stack:
            node, it = stack[-1]
            for a in it:
                if a.__class__ is _In and not a.node.done and id(a.node) not in seen:
                    seen.add(id(a.node))
                    stack.append((a.node, iter(a.node.inputs)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _finish(node, outs):
    results = []
    for ref, real in zip(node.outputs, outs):
        ph = ref()
        results.append(_adopt(ph, real) if ph is not None and ph.__class__ is LazyTensor else real)
    node.results = tuple(results)
    node.done = True
    node.inputs = ()
    node.fn = None


def run_node(node):
    """Compute one node through the eager path under its recorded grad mode."""
    inputs = [a.value() if a.__class__ is _In else a for a in node.inputs]
    prev = _grad.enabled
    _grad.enabled = node.grad_mode
    try:
        out = eager_apply(node.fn, inputs)
    finally:
        _grad.enabled = prev
    _finish(node, out if isinstance(out, tuple) else (out,))


def _realize_nodes(targets):
    with _lock, suspended():
        order = _needed(targets)
        if not order:
            return
        for kind, item in fusion.plan(order, targets):
            if kind == "node":
                if not item.done:
                    run_node(item)
            else:
                fusion.run_group(item, run_node, _finish)


def realize(*tensors):
    """Compute the given tensors (no-op for realised ones); returns them."""
    targets = [t._lazy[0] for t in tensors if t.__class__ is LazyTensor]
    if targets:
        _realize_nodes(targets)
    return tensors[0] if len(tensors) == 1 else tensors


def _alive_targets(nodes):
    return [n for n in nodes if not n.done and any(ref() is not None for ref in n.outputs)]


def realize_pending():
    """Leaving lazy mode: compute every tensor recorded in this thread that is still referenced."""
    targets = _alive_targets(take_pending())
    if targets:
        _realize_nodes(targets)


def realize_all():
    """Compute every pending tensor of this thread that is still referenced (before writes that bypass the
    tensor API, such as an optimizer step, inside a lazy block)."""
    targets = _alive_targets(live_pending())
    if targets:
        _realize_nodes(targets)


def _shares(a, version):
    if a.__class__ is _In:
        return a.node.done and a.node.results[a.idx] is not None and a.node.results[a.idx]._version is version
    return isinstance(a, Tensor) and a.__class__ is not LazyTensor and a._version is version


def before_write(t):
    """``t``'s memory is about to change: compute the pending nodes that read it, directly or through lazy
    nodes depending on such readers (a lazy view of ``t`` shares its memory)."""
    version = t._version  # realises t itself when it is lazy
    hit = set()
    for node in live_pending():  # creation order: producers come before their consumers
        for a in node.inputs:
            if _shares(a, version) or (a.__class__ is _In and id(a.node) in hit):
                hit.add(id(node))
                break
    if hit:
        targets = _alive_targets([n for n in live_pending() if id(n) in hit])
        if targets:
            _realize_nodes(targets)


__all__ = ["LazyTensor", "LazyNode", "record", "realize", "realize_all", "realize_pending", "before_write"]
