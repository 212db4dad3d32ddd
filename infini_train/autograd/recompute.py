"""Activation recomputation (gradient checkpointing): ``checkpoint`` and ``checkpoint_sequential``, as in
torch.utils.checkpoint.

``checkpoint(function, *args, **kwargs)`` returns what ``function(*args, **kwargs)`` returns but keeps none of the
activations computed inside it for backward, only its inputs (and the random and autocast state it ran under).
When backward reaches its outputs, the function runs again with grad enabled from detached copies of the inputs,
and the gradients of that recomputed graph go on to the original inputs and to every other tensor the function
used (its parameters, a tensor it captured), through one graph node, ``Checkpoint``.

Forward. The function runs once, with grad enabled, on detached copies of its tensor inputs, so the graph it builds
shows where its gradients must go: the edges leaving that graph (to the input copies, to each parameter's
AccumulateGrad, to the producer of a captured tensor) become the Checkpoint node's edges, and the graph itself,
with the activations it saved, is dropped as soon as the function returns. Memory peaks inside the call as in a
plain recorded forward of the function (as its recomputation needs anyway); between forward and backward only the
inputs are kept, with the RNG snapshot (on a GPU that includes a copy of its generator's curand states, some MB).
Autocast casts made inside use a cache of the call's own, so they die with the graph too. The nodes the call built
are those that died with it, plus those still alive (kept by the function, e.g. in a hook) that lead to an input
copy; an alive node leading to none existed before the call.

Backward. The random streams (``backend.get_rng_state_all``: the default stream, every GPU generator, every named
fork) and the autocast state are set to what the forward saw, the function runs again, and the streams are put
back: the recomputation draws the same dropout masks, and the streams end where they were. The recomputed graph's
backward runs as a nested pass bounded by the Checkpoint node's edges: it counts and runs only the nodes the
recomputation built, so the counters of the pass outside are untouched. With create_graph=True the recomputation
is connected to the original inputs, so its gradients can be differentiated again.

``use_reentrant``: torch has two implementations; here True, False and None all run this one, which has the
semantics of torch's use_reentrant=False (inputs need not require grad, ``autograd.grad`` works through it,
keyword arguments are passed on).
"""
from __future__ import annotations

import contextlib
import weakref

from .. import backend
from . import autocast as _autocast
from .accumulate import AccumulateGrad
from .engine import BoundedPass
from .function import Function, Op, _tensor_class
from .grad_mode import _state as _grad
from .grad_mode import enable_grad

__all__ = ["checkpoint", "checkpoint_sequential", "Checkpoint", "register_forward_state"]

_DETERMINISM_HINT = ("the function must compute the same way from the same inputs each time: no branching on "
                     "global state, no tensor created with requires_grad=True inside it, and a tensor it keeps "
                     "(e.g. stored on a module) stored detached. determinism_check='none' skips the graph-size check")


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, context_fn=None,
               determinism_check="default", debug=False, early_stop=True, **kwargs):
    """``function(*args, **kwargs)``, recomputed in backward instead of keeping its activations (torch's
    ``torch.utils.checkpoint.checkpoint``).

    Outputs may be a Tensor or tuples/lists/dicts holding Tensors and other values; tensor inputs may sit in
    ``args`` and ``kwargs`` (also inside tuples, lists and dicts) and need not require grad. Under no_grad the
    function is just called. ``preserve_rng_state``: the recomputation replays the forward's random draws.
    ``context_fn``: returns two context managers, the forward runs inside the first and the recomputation inside
    the second. ``determinism_check``: "default" checks that the recomputation builds the graph the forward built;
    "none" skips that. ``use_reentrant`` and ``early_stop`` are accepted for compatibility (see the module
    docstring; the recomputation always runs the whole function). ``debug=True`` is not supported.
    """
    if not callable(function):
        raise TypeError(f"checkpoint: expected a callable function, got {type(function).__name__}\n"
                        "HINT: checkpoint(module_or_function, *inputs)")
    if use_reentrant is not None and not isinstance(use_reentrant, bool):
        raise ValueError(f"checkpoint: expected use_reentrant True, False or None, got {use_reentrant!r}")
    if determinism_check not in ("default", "none"):
        raise ValueError(f"checkpoint: expected determinism_check 'default' or 'none', got {determinism_check!r}")
    if debug:
        raise ValueError("checkpoint: debug=True is not supported (it traces the ops of a recomputation that "
                         "differs from the forward).\nHINT: leave debug=False; a differing recomputation raises "
                         "with the graph sizes it found")
    if not isinstance(early_stop, bool):
        raise ValueError(f"checkpoint: expected early_stop True or False, got {early_stop!r}")
    forward_context, recompute_context = _contexts(context_fn)
    if not _grad.enabled:
        with forward_context:
            return function(*args, **kwargs)
    node = Checkpoint(function, bool(preserve_rng_state), recompute_context, determinism_check)
    return node.run(args, kwargs, forward_context)


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Run ``functions`` (a Sequential or a list of callables) one after another on ``input``, in ``segments``
    chunks, each but the last checkpointed (torch's ``checkpoint_sequential``)."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"checkpoint_sequential: unexpected keyword arguments {sorted(kwargs)}\n"
                         "HINT: only use_reentrant and preserve_rng_state are accepted")
    if callable(getattr(functions, "children", None)):  # a Sequential (nn sits above autograd: no import)
        functions = list(functions.children())
    functions = list(functions)
    n = len(functions)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= n:
        raise ValueError(f"checkpoint_sequential: expected segments an int in [1, {n}] (the number of functions), "
                         f"got {segments!r}")
    size = n // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(_segment(functions, start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return _segment(functions, end + 1, n - 1)(input)


def _segment(functions, start, end):
    def run(x):
        for fn in functions[start:end + 1]:
            x = fn(x)
        return x

    return run


FORWARD_STATES = []  # (capture, restore) of thread-local state a forward runs under, set again for its recomputation


def register_forward_state(capture, restore):
    """Have every recomputation run under the state ``capture()`` returned when its forward ran (``restore(state)``
    sets it; the state of the moment is put back afterwards), as the RNG and autocast state are: e.g. the group a
    context-parallel forward ran its attention over."""
    FORWARD_STATES.append((capture, restore))


def _contexts(context_fn):
    if context_fn is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    if not callable(context_fn):
        raise TypeError(f"checkpoint: expected context_fn a callable, got {type(context_fn).__name__}")
    pair = context_fn()
    if not (isinstance(pair, tuple) and len(pair) == 2
            and all(hasattr(c, "__enter__") and hasattr(c, "__exit__") for c in pair)):
        raise TypeError(f"checkpoint: context_fn must return two context managers, got {pair!r}\n"
                        "HINT: context_fn=lambda: (forward_context, recompute_context)")
    return pair


class Checkpoint(Function):
    """The graph node of one checkpointed call: its edges lead to the inputs and to every other tensor the
    function's graph reached; backward recomputes that graph and runs it (see the module docstring)."""

    _arrays = True  # backward on arrays; backward_graph on Tensors (create_graph=True)

    def __init__(self, function, preserve_rng_state, recompute_context, determinism_check):
        self.function = function
        self.preserve_rng_state = preserve_rng_state
        self.recompute_context = recompute_context
        self.determinism_check = determinism_check

    # ------------------------------------------------------------------------------------------- forward
    def run(self, args, kwargs, forward_context):
        Tensor = _tensor_class()
        inputs = []
        self.spec = _map((args, kwargs), Tensor, lambda t: _slot(inputs, t))
        self.requires = [t._requires_grad for t in inputs]
        self.save_for_backward(*inputs)  # before the call: an in-place change of an input inside it is then caught
        self.rng = backend.get_rng_state_all() if self.preserve_rng_state else None
        self.autocast = _autocast.snapshot()
        self.states = [capture() for capture, _ in FORWARD_STATES]
        leaves = [_leaf(t, req) for t, req in zip(inputs, self.requires)]
        fargs, fkwargs = _fill(self.spec, leaves)
        with forward_context, _own_cast_cache():
            out = self.function(*fargs, **fkwargs)
        del fargs, fkwargs
        flat = _tensors(out)
        picked = [i for i, t in enumerate(flat) if t._requires_grad]
        if not picked:  # nothing to differentiate: no graph, nothing kept
            _unlink(leaves)
            return out
        result, walk = self._wrap_outputs(out, flat, picked)
        del out, flat  # the forward's graph dies here, unless the function kept part of it
        self._connect(walk, inputs, leaves)
        _unlink(leaves)
        return result

    def _wrap_outputs(self, out, flat, picked):
        """Fresh output tensors whose grad_fn is this node, and the forward's graph by weak reference."""
        Tensor = _tensor_class()
        wrappers = {}
        roots = []
        for m, i in enumerate(picked):
            o = flat[i]
            roots.append(_graph_node(o) + (o.array.shape, o.array.dtype))
            w = Tensor._make(o.array, o.device, True)
            w._version = o._version
            w.grad_fn, w._output_idx = self, m
            wrappers[i] = w
        self._positions = picked
        self._num_tensors = len(flat)
        self._num_outputs = len(picked)
        self._output_meta = [(r[2], r[3]) for r in roots]
        self.device = flat[picked[0]].device
        self.xp = backend.get_xp(self.device)
        count = iter(range(len(flat)))
        return _map(out, Tensor, lambda t: wrappers.get(next(count), t)), _walk(roots)

    def _connect(self, walk, inputs, leaves):
        """Set this node's edges: the inputs that require grad, then where the forward's graph leaves the call."""
        roots, nodes = walk
        leaf_index = {id(leaf): k for k, leaf in enumerate(leaves) if leaf._requires_grad}
        ours = _built_by_call(nodes, leaf_index)
        self._inner_count = len(ours)
        edges = []
        self._input_edges = []
        for k, t in enumerate(inputs):
            if self.requires[k]:
                self._input_edges.append((k, len(edges)))
                edges.append(_graph_node(t) + (t.array.shape, t.array.dtype))
        self._boundary = {}
        targets = list(roots)
        for nid in ours:
            targets.extend(nodes[nid][1])
        for ref, idx, shape, dtype in targets:
            if isinstance(ref, AccumulateGrad):
                if id(ref.tensor) in leaf_index:
                    continue
                node = ref
            else:
                node = ref()
                if node is None or id(node) in ours:
                    continue
            key = (id(node), idx)
            if key not in self._boundary:
                self._boundary[key] = len(edges)
                edges.append((node, idx, shape, dtype))
        self.next_functions = tuple((node, idx) for node, idx, _, _ in edges)
        self.needs_input_grad = (True,) * len(edges)
        self._input_shapes = tuple(e[2] for e in edges)
        self._input_dtypes = tuple(e[3] for e in edges)

    # ------------------------------------------------------------------------------------------ backward
    def backward(self, *grads):
        return self._recompute(grads, create_graph=False)

    def backward_graph(self, *grads):
        return self._recompute(grads, create_graph=True)

    def _recompute(self, grads, create_graph):
        saved = self.saved_tensors  # connected during create_graph; raises on a freed graph or a changed input
        leaves = [_Alias().apply(t) if req and create_graph else _leaf(t, req)
                  for t, req in zip(saved, self.requires)]
        args, kwargs = _fill(self.spec, leaves)
        rng_now = backend.get_rng_state_all() if self.rng is not None else None
        autocast_now = _autocast.snapshot()
        states_now = [capture() for capture, _ in FORWARD_STATES]
        try:
            if self.rng is not None:
                backend.set_rng_state_all(self.rng)
            _autocast.restore(self.autocast)
            for (_, restore), state in zip(FORWARD_STATES, self.states):
                restore(state)
            with enable_grad(), _own_cast_cache(), self.recompute_context:
                out = self.function(*args, **kwargs)
        finally:
            _autocast.restore(autocast_now)
            for (_, restore), state in zip(FORWARD_STATES, states_now):
                restore(state)
            if rng_now is not None:
                backend.set_rng_state_all(rng_now)
        del args, kwargs
        roots = self._recomputed_roots(out, grads)
        del out
        leaf_nodes = {id(_graph_node(leaf)[0]): k for k, leaf in enumerate(leaves) if leaf._requires_grad}
        stop = {id(node) for node, _ in self.next_functions} | leaf_nodes.keys()
        recomputed = BoundedPass(roots, lambda fn: id(fn) in stop or isinstance(fn, AccumulateGrad))
        count = recomputed.num_nodes
        strangers = [fn for fn in recomputed.reached_ends if id(fn) not in stop]  # leaves the forward did not use
        if strangers:
            shapes = ", ".join(str(tuple(s.tensor.shape)) for s in strangers)
            raise RuntimeError(f"checkpoint: the recomputation reached leaf tensors the forward did not use "
                               f"(shapes {shapes}).\nHINT: {_DETERMINISM_HINT}")
        if self.determinism_check == "default" and count != self._inner_count:
            raise RuntimeError(f"checkpoint: the recomputation built {count} graph nodes, the forward built "
                               f"{self._inner_count}.\nHINT: {_DETERMINISM_HINT}")
        prev = _grad.enabled
        _grad.enabled = create_graph
        try:
            captured = recomputed.run(create_graph)
        finally:
            _grad.enabled = prev
        result = [None] * len(self.next_functions)
        for k, pos in self._input_edges:
            result[pos] = captured.get((id(_graph_node(leaves[k])[0]), 0))
        for key, pos in self._boundary.items():
            result[pos] = captured.get(key)
        _unlink(leaves)
        return tuple(result)

    def _recomputed_roots(self, out, grads):
        flat = _tensors(out)
        ok = len(flat) == self._num_tensors
        for m, i in enumerate(self._positions):
            ok = ok and flat[i]._requires_grad and flat[i].array.shape == self._output_meta[m][0]
        if not ok:
            raise RuntimeError(
                f"checkpoint: the recomputed function returned {_describe(flat)}; the forward returned "
                f"{self._num_tensors} tensors, those at {self._positions} requiring grad with shapes "
                f"{[meta[0] for meta in self._output_meta]}.\nHINT: {_DETERMINISM_HINT}")
        return [_graph_node(flat[i]) + (grads[m],) for m, i in enumerate(self._positions)]

    def _release(self):
        super()._release()
        self.rng = self.spec = self.states = None  # the RNG snapshot holds copies of the GPU generators' states


class _Alias(Op):
    """x -> x as a node of its own: where a create_graph recomputation stops, connected on to the input."""

    def forward(self, a):
        return a

    def backward(self, g):
        return g

    backward_graph = backward


# ------------------------------------------------------------------------------------- the forward's graph
def _walk(roots):
    """The graph reachable from ``roots`` ((node, index, shape, dtype) each), every node held by weak reference
    (leaves' AccumulateGrad strongly: they outlive the call anyway), so that it dies with the function's frame.
    Returns (roots, {id(node): (ref, edges)}) with edges as (ref, index, shape, dtype)."""
    nodes = {}
    refs = []
    stack = []
    for node, idx, shape, dtype in roots:
        refs.append((_ref(node), idx, shape, dtype))
        if not isinstance(node, AccumulateGrad):
            stack.append(node)
    while stack:
        fn = stack.pop()
        if id(fn) in nodes:
            continue
        edges = []
        for k, (nxt, idx) in enumerate(fn.next_functions):
            if nxt is None:
                continue
            edges.append((_ref(nxt), idx, fn._input_shapes[k], fn._input_dtypes[k]))
            if not isinstance(nxt, AccumulateGrad) and id(nxt) not in nodes:
                stack.append(nxt)
        nodes[id(fn)] = (weakref.ref(fn), edges)
    return refs, nodes


def _ref(node):
    return node if isinstance(node, AccumulateGrad) else weakref.ref(node)


def _built_by_call(nodes, leaf_index):
    """Ids of the walked nodes the call built: the dead ones, and the live ones leading to an input copy (a node
    that existed before the call cannot lead to one)."""
    alive = {nid for nid, (ref, _) in nodes.items() if ref() is not None}
    ours = set(nodes) - alive
    consumers = {}
    stack = []
    for nid in alive:
        for ref, _, _, _ in nodes[nid][1]:
            if isinstance(ref, AccumulateGrad):
                if id(ref.tensor) in leaf_index:
                    stack.append(nid)
            else:
                consumers.setdefault(id(ref()), []).append(nid)
    while stack:
        nid = stack.pop()
        if nid not in ours:
            ours.add(nid)
            stack.extend(consumers.get(nid, ()))
    return ours


# ------------------------------------------------------------------------------------------------ helpers
class _Slot:
    """Where tensor input ``index`` sits in the saved (args, kwargs)."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _slot(inputs, t):
    inputs.append(t)
    return _Slot(len(inputs) - 1)


def _fill(spec, leaves):
    return _map(spec, _Slot, lambda s: leaves[s.index])


def _map(obj, kind, fn):
    """``obj`` with ``fn(x)`` for every ``x`` of type ``kind`` in it, through tuples (named too), lists, dicts."""
    if isinstance(obj, kind):
        return fn(obj)
    if type(obj) is tuple:
        return tuple(_map(o, kind, fn) for o in obj)
    if type(obj) is list:
        return [_map(o, kind, fn) for o in obj]
    if type(obj) is dict:
        return {k: _map(v, kind, fn) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map(o, kind, fn) for o in obj))
    return obj


def _tensors(obj):
    found = []
    _map(obj, _tensor_class(), found.append)
    return found


def _leaf(t, requires_grad):
    leaf = t.detach()  # shares the version counter: an in-place change inside the function shows on the input
    leaf._requires_grad = requires_grad
    return leaf


def _unlink(leaves):
    for leaf in leaves:
        leaf._accumulate = None  # a leaf and its AccumulateGrad point at each other


def _graph_node(t):
    if t.grad_fn is not None:
        return t.grad_fn, t._output_idx
    return t._accumulate_node(), 0


def _describe(flat):
    return "[" + ", ".join(f"Tensor(shape={tuple(t.shape)}, requires_grad={t._requires_grad})" for t in flat) + "]"


@contextlib.contextmanager
def _own_cast_cache():
    """An autocast cast cache of the call's own: its casts die with its graph, and a recomputation never reuses a
    cast made outside (which may be stale by then)."""
    state = _autocast._state
    saved, state.cache = state.cache, {}
    try:
        yield
    finally:
        state.cache = saved
