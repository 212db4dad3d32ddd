"""Split backward: the gradients with respect to a graph's inputs now (B), those with respect to its weights later (W),
as zero-bubble pipeline schedules run a stage's backward (the previous stage waits only for B).

``backward_input(tensors, grad_tensors, inputs)`` runs the nodes from which a gradient reaches ``inputs`` (leaves:
a pipeline stage's received activations), counted by the engine's dependency counting, and accumulates into the
inputs' ``.grad``. A node of that part whose other edges lead only to weights (a linear layer's weight and bias, a
norm's scale, a LoRA adapter, an expert) computes only the edges toward the inputs: its ``needs_input_grad`` is
narrowed for the call, as an op already reads it to skip what no one needs. It keeps its saved tensors and its
output gradients for the weight half. An op that computes every gradient anyway (or a recomputed block, whose
Checkpoint node runs its whole recomputation) hands the weight-side gradients over as they are, kept until W.
Nodes leading to no input (a weight's autocast cast, an embedding, a first stage's whole graph) wait for W.

``WeightGradients.backward_weight()`` then runs the weight half: each narrowed node once more with the other
edges, in the order B met them, and the nodes behind them, by dependency counting as one pass: AccumulateGrad and
its post-accumulate hooks (DDP's bucketed all-reduce, ZeRO's reduce-scatter, fully_shard's reshard) run here.
Engine callbacks queued during B (fully_shard's end of backward) run at the end of W, where the pass they belong
to ends. B then W computes what one whole backward computes, with the same operations on the same values.

``input_half_only(inputs)``: inside it, ``backward()`` (``loss.backward()``, a GradScaler's) runs its input half only
and the weight halves collect in the list it yields: how a pipeline splits the backward of a loss that the caller's
own code scales and backpropagates.

``held_bytes``: the memory W holds between the two (the narrowed nodes' saved tensors and output gradients, the
handed-over gradients), as the pipeline reports it.
"""
from __future__ import annotations

import contextlib

from ..lazy_mode.mode import _state as _lazy_state
from .engine import _count_dependencies, _graph_node, _leading_to, _roots, pass_state
from .grad_mode import _state
from .observers import ACTIVE as _OBSERVERS
from .observers import observed_backward


class WeightGradients:
    """The weight half of a backward that ``backward_input`` split: ``backward_weight()`` runs it, once."""

    def __init__(self, external):
        self.items = []  # in the order B met them: ("narrowed", node, grads, weight-side target ids) | ("ready", edges)
        self.callbacks = []
        self.external = external
        self.done = False

    @property
    def held_bytes(self):
        """Bytes of the arrays only the weight half still needs: output gradients, handed-over gradients and saved
        activations, each array once (parameters, which live anyway, are not counted)."""
        arrays = {}
        for item in self.items:
            if item[0] == "narrowed":
                node = item[1]
                arrays.update((id(g), g) for g in item[2] if g is not None)
                if not node._packed:
                    arrays.update((id(e[0]), e[0]) for e in node._saved or () if e is not None and not _leaf(e))
            else:
                arrays.update((id(g), g) for _, g, _ in item[1] if g is not None)
        return sum(int(getattr(a, "nbytes", 0)) for a in arrays.values())

    def backward_weight(self):
        """Compute the weight gradients and accumulate them (hooks fire as in a whole backward)."""
        if self.done:
            raise RuntimeError("backward_weight: this split backward's weight half already ran\nHINT: call it once "
                               "per backward_input")
        self.done = True
        targets = []
        for item in self.items:
            if item[0] == "narrowed":
                targets += [fn for fn, _ in item[1].next_functions if fn is not None and id(fn) in item[3]]
            else:
                targets += [fn for fn, _, _ in item[1]]
        _count_dependencies(list({id(fn): fn for fn in targets}.values()))
        for fn in targets:
            fn.increase_dependencies_number()
        outer = pass_state.handed, pass_state.callbacks
        pass_state.handed, pass_state.callbacks = self.external, self.callbacks
        grad_mode, lazy_mode = _state.enabled, _lazy_state.enabled
        _state.enabled = _lazy_state.enabled = False
        try:
            items, self.items = self.items, []
            for item in items:
                if item[0] == "narrowed":
                    _, node, grads, weight_side = item
                    edges = _narrowed(node, grads, weight_side, False)
                else:
                    edges = item[1]
                _drain(list(edges))
            callbacks = pass_state.callbacks
            while callbacks:
                callbacks.pop(0)()
        finally:
            _state.enabled, _lazy_state.enabled = grad_mode, lazy_mode
            pass_state.handed, pass_state.callbacks = outer


def backward_input(tensors, grad_tensors=None, inputs=()):
    """Backward from ``tensors`` (seeded with ``grad_tensors``) restricted to the gradients of ``inputs`` (tensors
    that require grad: leaves accumulate into ``.grad``); returns the WeightGradients that computes the rest."""
    from ..tensor import Tensor

    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
    roots, external = _roots(tensors, grad_tensors, False, "backward_input")
    for k, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise RuntimeError(f"backward_input: input {k} does not require grad\nHINT: pass the tensors whose "
                               "gradients the input half must compute (a stage's received activations)")
    root_fns = [fn for fn, _, _ in roots]
    input_ids = {id(_graph_node(t)[0]) for t in inputs}
    input_side = _leading_to(root_fns, input_ids) | input_ids
    _count_dependencies(root_fns)
    for fn in root_fns:
        fn.increase_dependencies_number()
    split = WeightGradients(external)
    outer = pass_state.handed, pass_state.callbacks, pass_state.input_half
    pass_state.handed, pass_state.callbacks, pass_state.input_half = external, split.callbacks, None
    grad_mode, lazy_mode = _state.enabled, _lazy_state.enabled
    _state.enabled = _lazy_state.enabled = False
    try:
        work = list(reversed(roots))
        while work:
            fn, grad, idx = work.pop()
            if id(fn) not in input_side:  # a root from which no input is reached: all of it is weight side
                split.items.append(("ready", [(fn, grad, idx)]))
                continue
            if not fn._collect(grad, idx):
                continue
            weight_side = {id(n) for n, _ in fn.next_functions if n is not None and id(n) not in input_side}
            if not weight_side:
                work.extend(_observed(fn, lambda f=fn: f._run_backward(False, False)))
                continue
            grads = fn._take_grads()
            if grads is None:  # nothing flowed in: "no gradient" both ways, so the counts still close
                fn._release()
                edges = [(n, None, i) for n, i in fn.next_functions if n is not None]
            else:
                edges = _narrowed(fn, grads, weight_side, True)
            handed = [e for e in edges if id(e[0]) in weight_side]
            if grads is not None and any(g is None for _, g, _ in handed):
                split.items.append(("narrowed", fn, grads, weight_side))
            else:  # every weight-side gradient computed already (or none flowed in): nothing of the node is kept
                fn._release()
                split.items.append(("ready", handed))
            work.extend(e for e in edges if id(e[0]) not in weight_side)
    finally:
        _state.enabled, _lazy_state.enabled = grad_mode, lazy_mode
        pass_state.handed, pass_state.callbacks, pass_state.input_half = outer
    return split


@contextlib.contextmanager
def input_half_only(inputs):
    """``backward()`` calls inside run ``backward_input(..., inputs)``; yields the list of their WeightGradients."""
    halves = []
    outer = pass_state.input_half
    pass_state.input_half = (tuple(inputs), halves)
    try:
        yield halves
    finally:
        pass_state.input_half = outer


def _narrowed(fn, grads, weight_side, input_half):
    """``fn``'s backward for one half of its edges: those toward the inputs (``input_half``), keeping what the other
    half needs, or those toward the weights, releasing it."""
    full = fn.needs_input_grad
    fn.needs_input_grad = tuple(need and ((id(n) in weight_side) != input_half)
                                for need, (n, _) in zip(full, fn.next_functions))
    try:
        edges = _observed(fn, lambda: fn._backward_with(grads, input_half, False))
    finally:
        fn.needs_input_grad = full
    return edges if input_half else [e for e in edges if id(e[0]) in weight_side]


def _drain(work):
    while work:
        fn, grad, idx = work.pop()
        work.extend(fn.backward_partial(grad, idx, False, False))


def _observed(fn, run):
    return observed_backward(fn, run) if _OBSERVERS else run()


def _leaf(entry):
    """Whether a saved entry is a leaf that requires grad (a parameter: it lives whether or not W runs)."""
    ref = entry[3]
    return isinstance(ref, tuple) and ref[1] < 0


__all__ = ["backward_input", "input_half_only", "WeightGradients"]
