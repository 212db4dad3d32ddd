"""The backward driver: dependency counting, run as a loop (never a recursion).

1. From the roots, walk the graph once and count for every reachable node how many gradient edges feed
   it (``increase_dependencies_number``); each root's seed gradient counts as one more edge.
2. Deliver gradients with ``backward_partial``. A node runs its backward only when all its edges have
   arrived, so it runs exactly once per pass and after all its consumers; what it returns is pushed on a
   work stack. A chain of 100,000 ops is 100,000 loop iterations, not 100,000 stack frames.
"""
from __future__ import annotations

import threading


class _PassState(threading.local):
    handed = None  # ids of gradient arrays already given to a leaf's .grad in this pass
    callbacks = None  # run once the current pass has finished (DDP waits for its all-reduces there)


pass_state = _PassState()


def queue_callback(fn):
    """Run ``fn()`` when the backward pass now running has delivered every gradient."""
    if pass_state.callbacks is None:
        raise RuntimeError("queue_callback: only valid while a backward pass is running (e.g. from a hook)")
    pass_state.callbacks.append(fn)


def _count_dependencies(root_fns):
    seen = set()
    stack = []
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
            if id(nxt) not in seen:
                seen.add(id(nxt))
                nxt._reset_for_pass()
                stack.append(nxt)
            nxt.increase_dependencies_number()


def backward(tensors, grad_tensors=None, retain_graph=False):
    """Accumulate gradients of ``tensors`` (seeded with ``grad_tensors``) into the leaves' ``.grad``."""
    from ..tensor import Tensor

    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    if len(grad_tensors) != len(tensors):
        raise ValueError(f"backward: got {len(tensors)} tensors but {len(grad_tensors)} gradients")

    roots = []
    external = set()
    for t, g in zip(tensors, grad_tensors):
        if not t.requires_grad:
            raise RuntimeError(
                "backward: the tensor does not require grad and has no grad_fn.\n"
                "HINT: was it computed under no_grad(), or from tensors without requires_grad=True?")
        if g is None:
            if t.array.size != 1:
                raise RuntimeError(
                    f"backward: grad can be implicitly created only for scalar outputs, got shape {t.shape}.\n"
                    "HINT: call .sum() or .mean() first, or pass gradient= of the same shape")
            garr = t.device.xp.ones_like(t.array) if t.device.xp is not None else t.array * 0 + 1
        else:
            garr = g.array if isinstance(g, Tensor) else t.device.array_module().asarray(g)
            if garr.shape != t.array.shape:
                raise ValueError(f"backward: gradient has shape {tuple(garr.shape)}, expected {t.shape}")
            external.add(id(garr))
        fn = t.grad_fn if t.grad_fn is not None else t._accumulate_node()
        roots.append((fn, garr, t._output_idx if t.grad_fn is not None else 0))

    _count_dependencies([fn for fn, _, _ in roots])
    for fn, _, _ in roots:
        fn.increase_dependencies_number()

    outer = pass_state.handed, pass_state.callbacks
    pass_state.handed, pass_state.callbacks = external, []
    try:
        work = list(reversed(roots))
        while work:
            fn, grad, idx = work.pop()
            more = fn.backward_partial(grad, idx, retain_graph)
            if more:
                work.extend(more)
        callbacks = pass_state.callbacks
        while callbacks:
            callbacks.pop(0)()
    finally:
        pass_state.handed, pass_state.callbacks = outer
