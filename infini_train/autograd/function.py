"""Function: the autograd graph node.

``Function.apply`` runs ``forward`` with grad disabled. When grad is enabled and an input requires grad,
it records ``next_functions`` edges (one per input: the producer's Function and output index, the leaf's
AccumulateGrad, or None) and calls ``setup_context`` so the node can save tensors for backward.

Backward is dependency counting (see engine.py): before a pass the engine counts, for every reachable
node, how many gradient edges feed it (``dependencies_number``). ``backward_partial(grad, idx)`` collects
one output's gradient; once ``dependencies_reached == dependencies_number`` the node runs its own
``backward`` and hands the input gradients on. The driver is a loop, never a recursion.

Two flavours share this machinery:
- ``Function``: the user-facing contract. forward/backward take and return Tensors.
- ``Op``: the built-in kernels. forward/backward take and return raw ``xp`` arrays (numpy or cupy), so
  one code path serves every device; ``self.xp`` and ``self.device`` are set by ``apply``.
"""
from __future__ import annotations

import sys

import numpy as np

from ..backend import CPU, Device, is_array_like, is_device_array
from .autocast import _state as _autocast
from .grad_mode import _state
from ..lazy_mode.mode import ACTIVE as _LAZY
from ..lazy_mode.mode import _state as _lazy_state
from .grad_sum import RowUpdates, add_gradients, dense
from .observers import ACTIVE as _OBSERVERS
from .observers import observed_apply, observed_backward
from . import saved_hooks
from .op_errors import OpError, ignore_fp_errors, op_error  # noqa: F401  (imported from here across the package)
from .saved_hooks import hooks as _SAVED_HOOKS

_ndarray = np.ndarray
_TENSOR = [None]  # the Tensor class, bound on first use (tensor.py imports this module)


def _tensor_class():
    if _TENSOR[0] is None:
        from ..tensor import Tensor
        _TENSOR[0] = Tensor
    return _TENSOR[0]


def sum_to(grad, shape):
    """Sum ``grad`` down to ``shape``: undoes numpy broadcasting in every binary op's backward. ``grad`` may be
    an array, or a Tensor during a create_graph backward (then the sum is recorded)."""
    if grad.shape == shape:
        return grad
    if grad.__class__ is _TENSOR[0]:
        return _sum_to_tensor(grad, shape)
    ndim = len(shape)
    lead = grad.ndim - ndim
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and grad.shape[i + lead] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    if lead:
        grad = grad.reshape(shape)
    return grad


def _sum_to_tensor(grad, shape):
    lead = grad.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and grad.shape[i + lead] != 1)
    if dims:
        grad = grad.sum(dim=dims, keepdim=True)
    return grad.reshape(shape) if lead else grad


def _describe(inputs):
    parts = []
    for x in inputs:
        if not is_array_like(x):
            parts.append(repr(x))
        elif is_device_array(x) or isinstance(x, np.generic):
            parts.append(f"array(shape={x.shape})")
        else:
            parts.append(f"Tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device})")
    return ", ".join(parts)


class Function:
    """Base class of every graph node. Subclass and implement forward/backward (setup_context optional).

    Instances are single-use graph nodes: ``y = MyFn(**config).apply(x, w)``.
    """

    differentiable = True  # False for ops whose outputs never carry gradients (comparisons, argmax)
    is_view = False  # True when output 0 aliases input 0's memory (shares its version counter)
    cross_device = False  # True for ops that move data between devices (comm functions)
    output_devices = None  # Op outputs live on the inputs' device unless set: a Device or one per output
    _arrays = False  # Op sets this: forward/backward on raw arrays

    # Defaults at class level, so a subclass __init__ need not call super().__init__().
    next_functions = ()
    needs_input_grad = ()
    dependencies_number = 0
    dependencies_reached = 0
    grad_outputs_reached = 0
    grad_outputs = None
    device = None
    xp = None
    _saved = None
    _saved_versions = None
    _saved_arrays = None
    _packed = False  # saved tensors went through saved_tensors_hooks (saved_hooks.py)
    _stash = None
    _freed = False
    _num_outputs = 1
    _output_meta = None
    _input_shapes = ()
    _input_dtypes = ()
    _pre_hooks = None
    _row_updates = False  # set by an embedding's backward on the node its RowUpdates goes to (grad_sum.py)
    _create_graph = False  # True while backward runs with create_graph (saved tensors come back connected)
    retain_graph = False  # True while backward runs on a graph that will be reused (stashes must survive)
    _precision_name = None  # the name the numerics checker (training/numerics.py) gave this node in forward

    backward_graph = None  # Op: backward on Tensors, recorded, for create_graph=True (double backward)

    # ------------------------------------------------------------------------------------ contract
    def forward(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def setup_context(self, inputs, outputs):
        """Save what backward needs (``self.save_for_backward(...)``). Runs only when a graph is recorded."""

    def backward(self, *grad_outputs):
        raise NotImplementedError(f"{type(self).__name__} must implement backward")

    @property
    def name(self):
        return type(self).__name__

    # --------------------------------------------------------------------------------- saving
    def save_for_backward(self, *tensors):
        """Save tensors (or None) for backward. Stored as arrays plus version, so no reference cycles; a tensor
        that requires grad also keeps where its gradient goes (its producer, or this node for an output), so
        that a backward run with create_graph=True can rebuild it connected to the graph."""
        saved = []
        versions = []
        for t in tensors:
            if t is None:
                saved.append(None)
                versions.append(None)
                continue
            ref = None
            if t._requires_grad:
                producer = t.grad_fn
                if producer is self:
                    ref = t._output_idx  # an output of this node: an int, never a reference to self
                elif producer is not None:
                    ref = (producer, t._output_idx)
                else:
                    ref = (t._accumulate_node(), -1)
            saved.append((t.array, t.device, t._version, ref))
            versions.append(t._version[0])
        if _SAVED_HOOKS.stack:
            saved = saved_hooks.pack(saved, tensors)
            self._packed = True
        self._saved = saved
        self._saved_versions = versions
        self._saved_changed()

    def _saved_changed(self):
        """Refresh the arrays ``saved_arrays`` hands out after ``_saved`` was written (packed ones are unpacked
        when asked for)."""
        self._saved_arrays = None if self._packed else tuple([None if e is None else e[0] for e in self._saved])

    def _freed_error(self):
        return RuntimeError(
            f"{self.name}: trying to backward through the graph a second time (its saved tensors "
            "were freed after the first backward).\n"
            "HINT: pass retain_graph=True to the first .backward() if you need to backward twice.")

    def _check_saved(self):
        if self._saved is None:
            if self._freed:
                raise self._freed_error()
            return ()
        for i, (entry, version) in enumerate(zip(self._saved, self._saved_versions)):
            if entry is not None and entry[2][0] != version:
                raise RuntimeError(
                    f"{self.name}: one of the variables needed for gradient computation has been modified by "
                    f"an inplace operation: saved tensor {i} of shape {tuple(entry[0].shape)} is at version "
                    f"{entry[2][0]}; expected version {version}.\n"
                    "HINT: replace the in-place op (add_, mul_, copy_, zero_, x[...] = ...) on that tensor with "
                    "an out-of-place one, or clone it before modifying.")
        return saved_hooks.unpacked(self._saved) if self._packed else self._saved

    @property
    def saved_tensors(self):
        """The saved tensors; during a create_graph backward they are connected to the graph (differentiable)."""
        make = _tensor_class()._make
        entries = self._check_saved()
        if not self._create_graph:
            return tuple(None if e is None else make(e[0], e[1]) for e in entries)
        return tuple(None if e is None else self._connected(e, make) for e in entries)

    def _connected(self, entry, make):
        array, device, version, ref = entry
        t = make(array, device)
        t._version = version
        if ref is not None:
            t._requires_grad = True
            if isinstance(ref, int):
                t.grad_fn, t._output_idx = self, ref
            elif ref[1] < 0:
                t._accumulate = ref[0]  # a leaf: ops on t send gradients to the leaf's AccumulateGrad
            else:
                t.grad_fn, t._output_idx = ref
        return t

    @property
    def saved_arrays(self):
        """The saved arrays; during a create_graph backward, the connected tensors instead (an op's backward
        written with operators and ``sum_to`` then serves as its double backward too)."""
        saved = self._saved
        if saved is None or self._create_graph:
            return self.saved_tensors if self._create_graph else self._check_saved()
        for entry, version in zip(saved, self._saved_versions):
            if entry is not None and entry[2][0] != version:
                self._check_saved()  # raises, naming the tensor modified in place
        arrays = self._saved_arrays
        return arrays if arrays is not None else tuple([None if e is None else e[0] for e in self._check_saved()])

    # ---------------------------------------------------------------------------------- forward
    def apply(self, *inputs):
        if _LAZY and _lazy_state.enabled:  # inside `with it.lazy():` (see lazy_mode/graph.py)
            from ..lazy_mode.graph import record
            return record(self, inputs)
        if _OBSERVERS:  # the profiler or the precision checker is watching
            return observed_apply(self, inputs, lambda: _apply(self, inputs, _TENSOR[0] or _tensor_class()))
        return _apply(self, inputs, _TENSOR[0] or _tensor_class())

    def link_views(self, base, outputs, grad_mode):
        """Mark the outputs of a view op as views of ``base``: shared memory, version counter and history."""
        out = outputs[0]
        if out is not None:
            out._version = base._version
            out._view = ViewInfo(base, self, base._version[0], grad_mode)

    def view_of(self, array):
        """A view op rebuilds its output from an array laid out like its input (see ViewInfo)."""
        raise NotImplementedError(f"{self.name} is not a view op")

    # --------------------------------------------------------------------------------- backward
    def increase_dependencies_number(self):
        self.dependencies_number += 1

    def _reset_for_pass(self):
        self.dependencies_number = 0
        self.dependencies_reached = 0
        self.grad_outputs_reached = 0
        self.grad_outputs = [None] * self._num_outputs

    def backward_partial(self, grad_output, idx, retain_graph=False, create_graph=False):
        """Collect the gradient of output ``idx``. When every edge has arrived, run backward.

        ``grad_output`` is an array (a Tensor under create_graph, or None when the consumer had no gradient
        for it). Returns the list of ``(next_function, grad, input_index)`` the engine must deliver next.
        """
        if not self._collect(grad_output, idx, create_graph):
            return ()
        if _OBSERVERS:
            return observed_backward(self, lambda: self._run_backward(retain_graph, create_graph))
        return self._run_backward(retain_graph, create_graph)

    def _collect(self, grad_output, idx, create_graph=False):
        """Add one incoming gradient; True once every edge counted for this pass has arrived."""
        if grad_output is not None:
            if not create_graph and isinstance(grad_output, _tensor_class()):
                grad_output = grad_output.array
            grads = self.grad_outputs
            if grads is None:
                self._reset_for_pass()
                self.dependencies_number = 1
                grads = self.grad_outputs
            prev = grads[idx]
            if prev is None:
                grads[idx] = grad_output
                self.grad_outputs_reached += 1
            else:
                grads[idx] = None
                unshared = sys.getrefcount(prev) == 2  # the local and getrefcount's argument: nothing else holds it
                grads[idx] = add_gradients(prev, grad_output, unshared)
        self.dependencies_reached += 1
        if self.dependencies_reached < self.dependencies_number:
            return False
        if self._row_updates:  # an embedding sent RowUpdates here: what runs next sees arrays only (grad_sum.py)
            self._row_updates = False
            if self.grad_outputs is not None:
                self.grad_outputs = [dense(g) for g in self.grad_outputs]
        return True

    def _run_backward(self, retain_graph, create_graph=False):
        grads = self._take_grads(create_graph)
        if grads is None:
            # nothing flowed into this node: propagate "no gradient" so the counts downstream still close
            if not retain_graph:
                self._release()
            return [(fn, None, i) for fn, i in self.next_functions if fn is not None]
        return self._backward_with(grads, retain_graph, create_graph)

    def _take_grads(self, create_graph=False):
        """The output gradients collected in this pass, through the tensor hooks and completed (zeros for outputs that
        got none); None when nothing flowed in."""
        grads = self.grad_outputs
        self.grad_outputs = None
        if grads is None or self.grad_outputs_reached == 0:
            return None
        if self._pre_hooks:
            grads = self._run_tensor_hooks(grads, create_graph)
        if self._num_outputs > 1:
            for i, g in enumerate(grads):
                if g is None:
                    shape, dtype = self._output_meta[i]
                    grads[i] = self.xp.zeros(shape, dtype)
                    if create_graph:
                        grads[i] = _tensor_class()._make(grads[i], self.device)
        return grads

    def _backward_with(self, grads, retain_graph, create_graph=False):
        """Run backward on the collected (hooked, completed) ``grads``; returns the edges to deliver next. The split
        backward (split_backward.py) calls it twice, with ``needs_input_grad`` narrowed to each half."""
        self.retain_graph = retain_graph
        prev = _state.enabled
        _state.enabled = create_graph
        try:
            dev = self.device
            if dev is not None and dev.type == "cuda":
                with dev.context():
                    result = self._graph_backward(grads) if create_graph else (
                        self.backward(*grads) if self._arrays else self._tensor_backward(grads))
            elif create_graph:
                result = self._graph_backward(grads)
            else:
                result = self.backward(*grads) if self._arrays else self._tensor_backward(grads)
        finally:
            _state.enabled = prev
        if not retain_graph:
            self._release()
        if not isinstance(result, tuple):
            result = (result,)
        nexts = self.next_functions
        if len(result) != len(nexts):
            raise RuntimeError(
                f"{self.name}.backward returned {len(result)} gradients, expected {len(nexts)} "
                "(one per forward input; use None for inputs without a gradient)")
        out = []
        shapes, dtypes = self._input_shapes, self._input_dtypes
        for k, (fn, i) in enumerate(nexts):
            if fn is None:
                continue
            g = result[k]
            if g is not None:
                if create_graph:
                    g = self._fix_graph_grad(g, k)
                else:
                    if g.__class__ is not _ndarray and self.xp is np and g.__class__ is not RowUpdates:
                        g = np.asarray(g)  # numpy turns 0-d results into scalars, which later in-place adds reject
                    if g.shape != shapes[k]:
                        g = self._fix_grad_shape(g, k)
                    if g.dtype != dtypes[k]:
                        g = g.astype(dtypes[k])  # a gradient has its input's dtype, whatever the op computed in
            out.append((fn, g, i))
        return out

    def _graph_backward(self, grads):
        """Backward for create_graph=True: on Tensors with grad recording on, so the result is differentiable."""
        Tensor = _tensor_class()
        grads = [g if isinstance(g, Tensor) else Tensor._make(g, self.device) for g in grads]
        if self._arrays and self.backward_graph is None:
            raise RuntimeError(
                f"{self.name}: backward with create_graph=True (double backward) is not supported by this op.\n"
                "HINT: double backward covers elementwise math, matmul/linear, reductions, activations, softmax "
                "and the shape/indexing ops; write this step as a custom Function whose backward uses tensor ops")
        self._create_graph = True
        try:
            if self._arrays:
                return self.backward_graph(*grads)
            return self.backward(*grads)
        finally:
            self._create_graph = False

    def _fix_graph_grad(self, g, k):
        Tensor = _tensor_class()
        if not isinstance(g, Tensor):
            g = Tensor._make(g, self.device)
        shape, dtype = self._input_shapes[k], self._input_dtypes[k]
        if g.shape != shape:
            if g.numel() != int(np.prod(shape)):
                raise RuntimeError(f"{self.name}.backward returned a gradient of shape {tuple(g.shape)} for input "
                                   f"{k}, expected shape {shape}")
            g = g.reshape(shape)
        if g.dtype != dtype:
            g = g.to(dtype)
        return g

    def _tensor_backward(self, grads):
        Tensor = _tensor_class()
        dev = self.device
        result = self.backward(*(Tensor._make(g, dev) for g in grads))
        if isinstance(result, tuple):
            return tuple(None if r is None else r.array for r in result)
        return None if result is None else result.array

    def _fix_grad_shape(self, g, k):
        shape = self._input_shapes[k]
        if g.size == int(np.prod(shape)) and g.ndim != len(shape):
            return g.reshape(shape)
        raise RuntimeError(
            f"{self.name}.backward returned a gradient of shape {tuple(g.shape)} for input {k}, "
            f"expected shape {shape}")

    def _run_tensor_hooks(self, grads, create_graph=False):
        Tensor = _tensor_class()
        for idx, hooks in self._pre_hooks.items():
            if grads[idx] is None:
                continue
            for hook in hooks:
                g = grads[idx]
                new = hook(g if create_graph and isinstance(g, Tensor) else Tensor._make(g, self.device))
                if new is not None:
                    grads[idx] = new if create_graph else new.array
        return grads

    def stash(self, *arrays):
        """Keep intermediates of forward (masks, statistics) for backward; dropped once backward ran."""
        self._stash = arrays

    @property
    def stashed(self):
        if self._stash is None and self._freed:
            raise self._freed_error()
        return self._stash

    def _release(self):
        if self._saved is not None or self._stash is not None:
            self._saved = self._saved_arrays = None
            self._stash = None
            self._freed = True

    def _add_pre_hook(self, idx, hook):
        if self._pre_hooks is None:
            self._pre_hooks = {}
        self._pre_hooks.setdefault(idx, []).append(hook)

    def __repr__(self):
        return f"<{self.name}>"


class Op(Function):
    """A built-in kernel: forward(*arrays) -> array | tuple of arrays; backward(*grad arrays) -> arrays.

    Non-Tensor inputs (Python scalars, None) are passed through to forward unchanged and get no gradient.
    Intermediates of forward go through ``self.stash(...)`` and are dropped once backward has run.
    """

    _arrays = True


def eager_apply(fn, inputs):
    """``fn.apply(*inputs)`` computed now, whatever the lazy mode (how lazy mode computes a recorded node)."""
    if _OBSERVERS:
        return observed_apply(fn, inputs, lambda: _apply(fn, inputs, _TENSOR[0] or _tensor_class()))
    return _apply(fn, inputs, _TENSOR[0] or _tensor_class())


def _alias(t, Tensor):
    out = Tensor._make(t.array, t.device)
    out._version = t._version
    return out


def _apply(fn, inputs, Tensor):
    # ---- device check (comm functions move data between devices and skip it)
    dev = None
    record = False
    grad_on = _state.enabled
    for t in inputs:
        if isinstance(t, Tensor):
            if dev is None:
                dev = t.device
            elif t.device is not dev and not fn.cross_device:
                raise op_error(
                    fn.name, "all tensor inputs on one device", f"inputs on {dev} and {t.device}",
                    "move them with .to(device) first (DataParallel/Scatter do this for you)")
            view = t._view
            if view is not None and view.version != t._version[0] and grad_on:
                _refresh_view(t)  # its base changed in place since its history was recorded
            if t._requires_grad:
                record = True
    if dev is None:
        dev = CPU
    fn.device = dev
    xp = fn.xp = dev.xp if dev.xp is not None else dev.array_module()
    if _autocast.active and fn._arrays:
        from .autocast import cast_inputs
        inputs = cast_inputs(fn, inputs, dev)
    if not grad_on or not fn.differentiable:
        record = False
    _state.enabled = False
    try:
        args = [t.array if isinstance(t, Tensor) else t for t in inputs] if fn._arrays else inputs
        if dev.type == "cuda":
            with dev.context():
                raw = fn.forward(*args)
        else:
            raw = fn.forward(*args)
    except (ValueError, TypeError, IndexError) as exc:
        if isinstance(exc, OpError) or "HINT" in str(exc):
            raise
        raise OpError(f"{fn.name}: {exc}\n  inputs: {_describe(inputs)}\n"
                      "HINT: check the shapes, dtypes and devices of the inputs above") from exc
    finally:
        _state.enabled = grad_on

    multi = isinstance(raw, tuple)
    if not multi and fn._arrays and fn.output_devices is None and raw is not None:
        # the common case, one array out on the inputs' device: skip the general loop below
        if xp is np and raw.__class__ is not _ndarray:
            raw = np.asarray(raw)
        outs = [Tensor._make(raw, dev)]
    elif fn._arrays:
        raws = raw if multi else (raw,)
        outs = []
        out_devs = fn.output_devices
        for i, a in enumerate(raws):
            if a is None:
                outs.append(None)
                continue
            odev = dev if out_devs is None else (out_devs if isinstance(out_devs, Device) else out_devs[i])
            if xp is np and a.__class__ is not _ndarray and odev.type != "cuda":  # (a copy to a GPU: a cupy array)
                a = np.asarray(a)
            outs.append(Tensor._make(a, odev))
    else:
        # a forward that hands back one of its inputs gets a fresh alias, so recording never rewires the input
        outs = [o if not any(o is t for t in inputs) else _alias(o, Tensor) for o in (raw if multi else (raw,))]

    if record:
        edges = []
        needs = []
        shapes = []
        dtypes = []
        for t in inputs:
            if isinstance(t, Tensor):
                arr = t.array
                shapes.append(arr.shape)
                dtypes.append(arr.dtype)
                if t._requires_grad:
                    gf = t.grad_fn
                    edges.append((gf, t._output_idx) if gf is not None else (t._accumulate_node(), 0))
                    needs.append(True)
                    continue
            else:
                shapes.append(None)
                dtypes.append(None)
            edges.append((None, 0))
            needs.append(False)
        fn.next_functions = tuple(edges)
        fn.needs_input_grad = tuple(needs)
        fn._input_shapes = tuple(shapes)
        fn._input_dtypes = tuple(dtypes)
        fn._num_outputs = len(outs)
        if len(outs) > 1:
            fn._output_meta = [(o.array.shape, o.array.dtype) if o is not None else ((), np.float32) for o in outs]
        for i, o in enumerate(outs):
            if o is not None and o.array.dtype.kind in "fV":  # floating (V: bfloat16)
                o._requires_grad = True
                o.grad_fn = fn
                o._output_idx = i
        fn.setup_context(inputs, tuple(outs) if multi else outs[0])
    if fn.is_view and isinstance(inputs[0], Tensor):
        fn.link_views(inputs[0], outs, grad_on)
    return tuple(outs) if multi else outs[0]


def _refresh_view(t):
    from .views import refresh_view
    refresh_view(t)


class ViewInfo:
    """How a view tensor aliases its ``parent``: ``maker.view_of(array)`` rebuilds the view from any array laid
    out like the parent's. ``version`` is the shared version counter's value when the view's history was last
    recorded: once the memory changes in place elsewhere (base or a sibling view), the view's grad_fn is
    regenerated from the base's new history before use. Views made under no_grad are never regenerated."""

    __slots__ = ("parent", "maker", "version", "grad_mode")

    def __init__(self, parent, maker, version, grad_mode):
        self.parent = parent
        self.maker = maker
        self.version = version
        self.grad_mode = grad_mode
