"""The backward driver: dependency counting, run as a loop (never a recursion).

1. From the roots, walk the graph once and count for every reachable node how many gradient edges feed
   it (``increase_dependencies_number``); each root's seed gradient counts as one more edge.
2. Deliver gradients with ``backward_partial``. A node runs its backward only when all its edges have
   arrived, so it runs exactly once per pass and after all its consumers; what it returns is pushed on a
   work stack. A chain of 100,000 ops is 100,000 loop iterations, not 100,000 stack frames.

``grad()`` (and ``backward(inputs=...)``) run only the nodes from which a requested input is reachable, and
``grad()`` hands back the gradients reaching its inputs instead of accumulating into ``.grad``. With
``create_graph=True`` gradients travel as Tensors and every backward step is itself recorded, so the result
can be differentiated again (double backward).
"""
from __future__ import annotations

import threading

from ..lazy_mode.mode import _state as _lazy_state
from .grad_mode import _state
from .observers import ACTIVE as _OBSERVERS
from .observers import observed_backward


class _PassState(threading.local):
    handed = None  # ids of gradient arrays already given to a leaf's .grad in this pass
    callbacks = None  # run once the current pass has finished (DDP waits for its all-reduces there)
    input_half = None  # inside split_backward.input_half_only: (inputs, the weight halves collected)


pass_state = _PassState()


def queue_callback(fn):
    """Run ``fn()`` when the backward pass now running has delivered every gradient."""
    if pass_state.callbacks is None:
        raise RuntimeError("queue_callback: only valid while a backward pass is running (e.g. from a hook)")
    pass_state.callbacks.append(fn)


def _count_dependencies(root_fns, ends=None):
    """Reset every node reachable from ``root_fns`` for a new pass and count the gradient edges feeding it.
    ``ends``: for a bounded pass, ``ends(node)`` is True where the pass stops; such nodes are neither counted nor
    walked past. Returns the number of nodes counted and the end nodes reached (in the order met)."""
    seen = set()
    stack = []
    reached_ends = []
    for fn in root_fns:
        if id(fn) not in seen:
            seen.add(id(fn))
            fn._reset_for_pass()
            stack.append(fn)
    while stack:
        fn = stack.pop()
        for nxt, _ in fn.next_functions:
            if nxt is None:
                continue
            if ends is not None and ends(nxt):
                reached_ends.append(nxt)
                continue
            if id(nxt) not in seen:
                seen.add(id(nxt))
                nxt._reset_for_pass()
                stack.append(nxt)
            nxt.increase_dependencies_number()
    return len(seen), reached_ends


class BoundedPass:
    """A backward pass over the part of a graph between ``roots`` ([(node, output index, gradient)]) and the nodes
    where ``ends(node)`` is True, counted by the engine's dependency counting: the gradients reaching an end node
    are summed and returned by ``run`` instead of delivered. Activation recomputation runs its recomputed graph
    this way, nested inside the pass that reached it, whose counters it leaves untouched. ``num_nodes``: the nodes
    the pass runs; ``reached_ends``: the end nodes it reaches (roots included)."""

    def __init__(self, roots, ends):
        self.roots, self.ends = roots, ends
        inner = [fn for fn, _, _ in roots if not ends(fn)]
        self.num_nodes, self.reached_ends = _count_dependencies(inner, ends)
        self.reached_ends += [fn for fn, _, _ in roots if ends(fn)]
        for fn in inner:
            fn.increase_dependencies_number()  # the seed gradient is one more edge

    def run(self, create_graph):
        """{(id(end node), output index): gradient}; the graph is kept only when create_graph needs it."""
        captured = {}
        ends = self.ends
        work = [(fn, g, idx) for fn, idx, g in reversed(self.roots)]
        while work:
            fn, grad, idx = work.pop()
            if ends(fn):
                if grad is not None:
                    key = (id(fn), idx)
                    prev = captured.get(key)
                    captured[key] = grad if prev is None else prev + grad
                continue
            work.extend(fn.backward_partial(grad, idx, create_graph, create_graph))
        return captured


def _leading_to(root_fns, targets):
    """Ids of the nodes that must run for gradients to reach the nodes in ``targets`` (ids): those with an
    edge into a target or into another such node. A target runs only if it leads to another target."""
    runners = set()
    done = set()
    for root in root_fns:
        stack = [(root, iter(root.next_functions))]
        while stack:
            fn, edges = stack[-1]
            for nxt, _ in edges:
                if nxt is not None and id(nxt) not in done:
                    stack.append((nxt, iter(nxt.next_functions)))
                    break
            else:
                stack.pop()
                done.add(id(fn))
                if any(nxt is not None and (id(nxt) in runners or id(nxt) in targets) for nxt, _ in fn.next_functions):
                    runners.add(id(fn))
    return runners


def _graph_node(t):
    """The node receiving ``t``'s gradient and the output index: its grad_fn, or a leaf's AccumulateGrad."""
    if t.grad_fn is not None:
        return t.grad_fn, t._output_idx
    return t._accumulate_node(), 0


def _roots(tensors, grad_tensors, create_graph, op):
    from ..tensor import Tensor

    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    tensors = tuple(tensors)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    grad_tensors = tuple(grad_tensors)
    if len(grad_tensors) != len(tensors):
        raise ValueError(f"{op}: got {len(tensors)} tensors but {len(grad_tensors)} gradients")
    roots = []
    external = set()
    for t, g in zip(tensors, grad_tensors):
        if t._view is not None and t._view.version != t._version[0] and _state.enabled:
            from .views import refresh_view
            refresh_view(t)
        if not t.requires_grad:
            raise RuntimeError(
                f"{op}: the tensor does not require grad and has no grad_fn.\n"
                "HINT: was it computed under no_grad(), or from tensors without requires_grad=True?")
        if g is None:
            if t.array.size != 1:
                raise RuntimeError(
                    f"{op}: grad can be implicitly created only for scalar outputs, got shape {t.shape}.\n"
                    "HINT: call .sum() or .mean() first, or pass gradient= of the same shape")
            g = Tensor._make(t.device.array_module().ones_like(t.array), t.device)
        else:
            if not isinstance(g, Tensor):
                g = Tensor._make(t.device.array_module().asarray(g), t.device)
            if g.shape != t.shape:
                raise ValueError(f"{op}: gradient has shape {tuple(g.shape)}, expected {t.shape}")
            if g.device.type != t.device.type or (g.device.type == "cuda" and g.device.index != t.device.index):
                raise ValueError(f"{op}: gradient is on {g.device}, expected the output's device {t.device}\n"
                                 f"HINT: create it with device=output.device, or move it with .to('{t.device}')")
            external.add(id(g.array))
        node, idx = _graph_node(t)
        roots.append((node, g if create_graph else g.array, idx))
    return roots, external


def _run(roots, external, retain_graph, create_graph, needed=None, captures=None):
    """Deliver the seed gradients through the graph. ``needed``: ids of the nodes allowed to run (None: all).
    ``captures``: {(id(node), output_index): slot}; the gradient arriving there is stored in the slot."""
    root_fns = [fn for fn, _, _ in roots]
    _count_dependencies(root_fns)
    for fn in root_fns:
        fn.increase_dependencies_number()
    captured = {}
    outer = pass_state.handed, pass_state.callbacks
    pass_state.handed, pass_state.callbacks = external, []
    grad_mode = _state.enabled
    _state.enabled = create_graph
    lazy_mode = _lazy_state.enabled
    _lazy_state.enabled = False  # backward (and a create_graph backward's ops) runs eagerly
    try:
        work = list(reversed(roots))
        while work:
            fn, grad, idx = work.pop()
            if needed is None:
                more = fn.backward_partial(grad, idx, retain_graph, create_graph)
            else:
                if not fn._collect(grad, idx, create_graph):
                    continue
                if captures:
                    for i, g in enumerate(fn.grad_outputs or ()):
                        slot = captures.get((id(fn), i))
                        if slot is not None and g is not None:
                            captured[slot] = g
                if id(fn) not in needed:
                    fn.grad_outputs = None
                    continue
                more = (observed_backward(fn, lambda f=fn: f._run_backward(retain_graph, create_graph)) if _OBSERVERS
                        else fn._run_backward(retain_graph, create_graph))
            if more:
                work.extend(more)
        callbacks = pass_state.callbacks
        while callbacks:
            callbacks.pop(0)()
    finally:
        _state.enabled = grad_mode
        _lazy_state.enabled = lazy_mode
        pass_state.handed, pass_state.callbacks = outer
    return captured


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate gradients of ``tensors`` (seeded with ``grad_tensors``) into the leaves' ``.grad``.

    ``inputs``: accumulate only into these leaves (and run only what leads to them). ``create_graph``: record
    the backward so the gradients can be differentiated again; ``retain_graph`` defaults to it."""
    if pass_state.input_half is not None and not create_graph and inputs is None:
        from .split_backward import backward_input
        wanted, halves = pass_state.input_half
        halves.append(backward_input(tensors, grad_tensors, wanted))
        return
    if retain_graph is None:
        retain_graph = create_graph
    roots, external = _roots(tensors, grad_tensors, create_graph, "backward")
    needed = None
    if inputs is not None:
        from ..tensor import Tensor
        inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
        if not inputs:
            raise RuntimeError("backward: inputs was given but is empty.\nHINT: pass None to accumulate into "
                               "every leaf")
        targets = []
        for t in inputs:
            if not t.requires_grad:
                raise RuntimeError("backward: every tensor in inputs must require grad")
            targets.append(_graph_node(t)[0])
        target_ids = {id(n) for n in targets}
        needed = _leading_to([fn for fn, _, _ in roots], target_ids) | target_ids  # the leaves accumulate
    _run(roots, external, retain_graph, create_graph, needed)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         materialize_grads=False):
    """The gradients of ``outputs`` with respect to ``inputs`` (torch.autograd.grad), as a tuple; no ``.grad``
    is touched. An input that ``outputs`` does not depend on gives None with ``allow_unused=True`` (zeros with
    ``materialize_grads=True``) and an error otherwise. ``create_graph=True`` returns gradients that are
    themselves differentiable (gradient penalties, Hessian-vector products)."""
    from ..tensor import Tensor

    if allow_unused is None:
        allow_unused = materialize_grads
    if materialize_grads and not allow_unused:
        raise ValueError("grad: materialize_grads=True needs allow_unused to be True (or left as None)")
    if retain_graph is None:
        retain_graph = create_graph
    single = isinstance(inputs, Tensor)
    inputs = (inputs,) if single else tuple(inputs)
    if not inputs:
        raise RuntimeError("grad: inputs is empty.\nHINT: pass the tensors to differentiate with respect to")
    captures = {}
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise RuntimeError(f"grad: input {k} does not require grad.\nHINT: create it with requires_grad=True "
                               "or call .requires_grad_() on it")
        node, idx = _graph_node(t)
        captures.setdefault((id(node), idx), []).append(k)
    roots, external = _roots(outputs, grad_outputs, create_graph, "grad")
    slots = {key: tuple(ks) for key, ks in captures.items()}
    needed = _leading_to([fn for fn, _, _ in roots], {key[0] for key in slots})
    captured = _run(roots, external, retain_graph, create_graph, needed, slots)
    result = [None] * len(inputs)
    for ks, g in captured.items():
        for k in ks:
            result[k] = g if isinstance(g, Tensor) else Tensor._make(g, inputs[k].device)
    for k, g in enumerate(result):
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    f"grad: input {k} was not used in the graph of the outputs.\n"
                    "HINT: pass allow_unused=True to get None for it (or materialize_grads=True for zeros)")
            if materialize_grads:
                result[k] = Tensor._make(inputs[k].device.array_module().zeros_like(inputs[k].array),
                                         inputs[k].device)
    return tuple(result)
