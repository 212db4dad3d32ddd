"""In-place ops with PyTorch's semantics: ``t.add_(x)``, ``t += x``, ``t[i] = v``, ``t.copy_(src)``, ...

With grad recording on and anything involved requiring grad, an in-place op is recorded as its out-of-place
op applied to ``t``'s current value, whose result is written back into ``t``'s memory: ``t``'s history is
rebased onto the new node (and, when ``t`` is a view, its base gets a CopySlices node; see autograd/views.py). Saved
tensors of the new node that the write would overwrite are kept as copies, as torch keeps ``original_self``.
As in torch, a leaf that requires grad (or a view of one) cannot be changed in place while grad mode is on.

Without recording (no_grad, or nothing requires grad) the op runs directly on the memory, allocation-free
for the arithmetic ufuncs: hand-written optimizer loops (``with no_grad(): p -= lr * p.grad``) stay cheap.
Either way the result must keep ``t``'s shape and be castable to its dtype, as torch requires.
"""
from __future__ import annotations

from ... import backend
from ...promotion import can_cast, promote_for_compute
from ...tensor import Tensor
from ...lazy_mode.mode import ACTIVE as _LAZY
from .conversion import Copy
from ..function import op_error
from ..grad_mode import _state
from .indexing import IndexPut, getitem, host_index, is_basic, normalize_index
from ..views import CopySlices, refresh_view, regenerate, resolve


def _alias(t):
    """A tensor standing for ``t``'s current value and history (memory and version counter shared)."""
    a = Tensor._make(t.array, t.device, t._requires_grad)
    a._version = t._version
    a.grad_fn, a._output_idx, a._accumulate = t.grad_fn, t._output_idx, t._accumulate
    return a


def check_writable(t, op):
    if _LAZY:  # lazy tensors reading t's memory compute before it changes (lazy_mode/graph.py)
        from ...lazy_mode.graph import before_write
        before_write(t)
    arr = t.array
    if any(s == 0 and n > 1 for s, n in zip(arr.strides, arr.shape)) or not backend.is_writeable(arr):
        raise RuntimeError(
            f"{op}: unsupported operation: more than one element of the written-to tensor refers to a single "
            f"memory location (an expanded view of shape {tuple(arr.shape)}).\n"
            "HINT: clone() the tensor before performing the operation")


def needs_graph(t, args):
    """Whether ``t.op_(*args)`` must be recorded (refreshing ``t``'s history first if it went stale)."""
    if not _state.enabled:
        return False
    info = t._view
    if info is not None and info.version != t._version[0]:
        refresh_view(t)
    if t._requires_grad:
        return True
    return any(isinstance(a, Tensor) and a._requires_grad for a in args)


def _check_not_leaf(t, op):
    if t.grad_fn is None and t._requires_grad:
        raise RuntimeError(
            f"{op}: a leaf tensor that requires grad is being used in an in-place operation.\n"
            "HINT: wrap the update in `with infini_train.no_grad():` (as optimizers do), or use the out-of-place op")
    if t._view is None:
        return
    root, _ = resolve(t)
    if root.grad_fn is None and root._requires_grad:
        raise RuntimeError(
            f"{op}: a view of a leaf tensor that requires grad is being used in an in-place operation.\n"
            "HINT: wrap the update in `with infini_train.no_grad():`, or clone() the view first")
    if not t._view.grad_mode and root._requires_grad:
        raise RuntimeError(
            f"{op}: a view created under no_grad is being modified in place with grad mode enabled; its base "
            "requires grad, so the gradient would be wrong.\nHINT: create the view with grad mode enabled, or "
            "modify it under no_grad")


def check_result(t, shape, dtype, op):
    if tuple(shape) != tuple(t.shape):
        raise RuntimeError(f"{op}: output with shape {tuple(t.shape)} doesn't match the broadcast shape "
                           f"{tuple(shape)}\nHINT: an in-place op cannot change the tensor's shape; use the "
                           "out-of-place op")
    if dtype != t.dtype and not can_cast(dtype, t.dtype):
        raise RuntimeError(f"{op}: result type {dtype} can't be cast to the desired output type {t.dtype}\n"
                           "HINT: convert the tensor first (e.g. .float()), or use the out-of-place op")


def _keep_saved_values(fn, version):
    """Saved tensors of ``fn`` sharing ``version`` are about to be overwritten: keep copies of them."""
    saved = fn._saved
    if not saved:
        return
    for i, entry in enumerate(saved):
        if entry is not None and entry[2] is version:
            saved[i] = (entry[0].copy(), entry[1], [0], entry[3])
            fn._saved_versions[i] = 0
    fn._saved_changed()


def _rebind_saved_output(fn, produced, t):
    """A saved output of ``fn`` now lives in ``t``'s memory: point it there (version-checked like t)."""
    saved = fn._saved
    if not saved:
        return
    for i, entry in enumerate(saved):
        if entry is not None and entry[0] is produced:
            saved[i] = (t.array, entry[1], t._version, entry[3])
            fn._saved_versions[i] = t._version[0]
    fn._saved_changed()


def apply_inplace(t, fn, args, op):
    """Record ``t.op(*args)`` as the out-of-place Function ``fn`` applied to (t, *args), written into t."""
    check_writable(t, op)
    _check_not_leaf(t, op)
    out = fn.apply(_alias(t), *args)
    check_result(t, out.shape, out.dtype, op)
    produced = out.array
    if out.dtype != t.dtype:
        out = out.to(t.dtype)
    _keep_saved_values(fn, t._version)
    if t._view is None:
        xp = t.device.array_module()
        xp.copyto(t.array, out.array)
        t._version[0] += 1
        t.grad_fn, t._output_idx, t._requires_grad = out.grad_fn, out._output_idx, out._requires_grad
    else:
        root, maker = resolve(t)
        base = CopySlices(maker, t.array).apply(_alias(root), out)
        t._version[0] += 1
        root.grad_fn, root._output_idx, root._requires_grad = base.grad_fn, 0, base._requires_grad
        regenerate(t, root, maker)
    _rebind_saved_output(fn, produced, t)
    return t


def operand(t, other, op):
    """``other`` as a raw operand for an op writing into ``t``: same device required for tensors."""
    if not isinstance(other, Tensor):
        return other
    if other.device is not t.device:
        raise op_error(op, "all tensor inputs on one device", f"inputs on {t.device} and {other.device}",
                       "move them with .to(device) first")
    return other.array


def run(t, fn, args, op, ufunc=None):
    """``t.op(*args)`` in place: recorded when needed, else directly on t's memory (through ``ufunc`` when given,
    allocation-free), else by computing the out-of-place result and copying it in."""
    if needs_graph(t, args):
        return apply_inplace(t, fn, args, op)
    check_writable(t, op)
    if ufunc is None:
        prev = _state.enabled
        _state.enabled = False
        try:
            out = fn.apply(t, *args)
        finally:
            _state.enabled = prev
        check_result(t, out.shape, out.dtype, op)
        t.device.array_module().copyto(t.array, out.array, casting="unsafe")
    else:
        raws = [t.array] + [operand(t, a, op) for a in args]
        raws, dtype, _ = promote_for_compute(*raws)  # low precision: float32 operands, rounded into t
        if dtype != t.dtype and not can_cast(dtype, t.dtype):
            check_result(t, t.shape, dtype, op)
        xp = t.device.array_module()
        try:
            getattr(xp, ufunc)(*raws, out=t.array, casting="unsafe")
        except ValueError as exc:
            shapes = ", ".join(str(tuple(getattr(r, "shape", ()))) for r in raws[1:])
            raise op_error(op, f"operands that broadcast to the tensor's shape {tuple(t.shape)}",
                           f"operand shapes {shapes}", "an in-place op cannot change the tensor's shape") from exc
    t._version[0] += 1
    return t


def copy(t, src):
    """``t.copy_(src)``: src (a tensor on any device, an array or a scalar) broadcast into t and cast to its dtype."""
    if needs_graph(t, (src,)):
        return apply_inplace(t, Copy(t.device), (src,), "copy_")
    if t.device is backend.META:  # no storage to write; the fill is recorded for sharded initialisation
        if isinstance(src, (int, float)):
            backend.record_init(t, "constant", float(src))
        else:
            backend.record_init(t, "copied")
        return t
    check_writable(t, "copy_")
    arr = src.array if isinstance(src, Tensor) else src
    if isinstance(src, Tensor) and src.device is not t.device:
        arr = backend.to_device_array(arr, t.device)
    try:
        t.device.array_module().copyto(t.array, arr, casting="unsafe")
    except ValueError as exc:
        raise op_error("copy_", f"a source broadcastable to the destination's shape {tuple(t.shape)}",
                       f"a source of shape {tuple(getattr(arr, 'shape', ()))}",
                       "copy_ writes every element of the destination; reshape or index the source") from exc
    t._version[0] += 1
    return t


def setitem(t, index, value):
    """``t[index] = value`` (Tensor.__setitem__): a view's copy_ for basic indices, index_put for advanced ones."""
    index = host_index(t, index)
    if isinstance(value, Tensor) and value.device is not t.device and not (value.ndim == 0 and
                                                                           value.device.type == "cpu"):
        raise op_error("__setitem__", f"a value on the tensor's device ({t.device})", f"a value on {value.device}",
                       "move it with .to(device) first")
    if needs_graph(t, (value,)):
        if is_basic(index):
            return apply_inplace(getitem(t, index), Copy(t.device), (value,), "__setitem__")
        index = normalize_index(t.device.array_module(), index, t.shape, "__setitem__")
        return apply_inplace(t, IndexPut(index), (value,), "__setitem__")
    check_writable(t, "__setitem__")
    if isinstance(value, Tensor):
        value = backend.to_device_array(value.array, t.device)
    try:
        t.array[index] = value
    except IndexError as exc:
        raise op_error("__setitem__", f"indices valid for a tensor of shape {tuple(t.shape)}", str(exc),
                       "indices count from 0; check them against the tensor's shape") from exc
    except ValueError as exc:
        try:
            target = tuple(t.array[index].shape)
        except (IndexError, ValueError):
            target = "the indexed shape"
        raise op_error("__setitem__", f"a value broadcastable to the indexed shape {target}",
                       f"a value of shape {tuple(getattr(value, 'shape', ()))}",
                       "the value must broadcast to the selected elements' shape") from exc
    t._version[0] += 1
