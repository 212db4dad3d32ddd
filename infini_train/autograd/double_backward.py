"""Double backward (``create_graph=True``) for ops whose first-order backward is a hand-written kernel.

Two ways, both exact:
- ``recomputed_grads``: the op's forward written again with differentiable ops (``composite``); its gradients,
  taken with create_graph, are the op's backward as a graph. Used where the backward depends on the inputs
  (layer norm, the losses, convolution, attention).
- ``LinearAdjoint``: for an op linear in an input (padding, pooling, embedding lookup, cumsum), its backward is a
  linear map of the incoming gradient alone; as an op of its own, its backward is the op's forward map again.
The numeric first-order backward of each op is untouched, so training speed does not change.
"""
from __future__ import annotations

from .. import backend
from ..tensor import Tensor
from .function import Function, Op
from .grad_mode import enable_grad


def graph_handle(t):
    """``t``'s place in the graph without its memory: a tensor of t's shape, dtype, version counter and graph
    node whose array is a broadcast zero (no storage). Saved for backward in place of a large tensor whose
    values the op can rebuild itself; a leaf is returned as it is (its owner keeps it alive anyway)."""
    if t.grad_fn is None:
        return t
    xp = t.device.array_module()
    handle = Tensor._make(xp.broadcast_to(xp.zeros((), t.dtype), tuple(t.shape)), t.device)
    handle._version = t._version
    handle.grad_fn, handle._output_idx, handle._requires_grad = t.grad_fn, t._output_idx, t._requires_grad
    return handle


def recomputed_grads(fn, composite, inputs, grads):
    """The gradients ``fn``'s inputs get from ``grads``, as tensors connected to the graph: those of
    ``composite(*inputs)`` (the forward recomputed with differentiable ops). ``inputs`` are fn's saved inputs
    (connected tensors, or None / constants); one entry per input, None where no gradient is needed."""
    needs = fn.needs_input_grad
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    tensors = [i for i, a in enumerate(inputs) if isinstance(a, Tensor)]
    wanted = [i for i in tensors if i < len(needs) and needs[i]]
    result = [None] * len(needs)
    if wanted:
        got = _RecomputedBackward(composite, inputs, tensors, wanted).apply(*(inputs[i] for i in tensors), *grads)
        for i, g in zip(wanted, got if isinstance(got, tuple) else (got,)):
            result[i] = g
    return tuple(result)


class _RecomputedBackward(Function):
    """(op inputs, output gradients) -> the op's input gradients, from ``composite`` recomputed on detached copies:
    its graph is a private one (the engine pass it runs in never touches the caller's nodes), and this node's own
    backward differentiates that graph once more (second order; a third is refused)."""

    def __init__(self, composite, inputs, tensor_positions, wanted):
        self.composite, self.inputs = composite, inputs
        self.tensor_positions, self.wanted = tensor_positions, wanted

    def forward(self, *tensors):
        from .engine import grad

        count = len(self.tensor_positions)
        with enable_grad():
            leaves = [_leaf(t) for t in tensors]
            args = list(self.inputs)
            for position, leaf in zip(self.tensor_positions, leaves[:count]):
                args[position] = leaf
            out = self.composite(*args)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            wanted = [leaves[self.tensor_positions.index(i)] for i in self.wanted]
            firsts = grad(outs, wanted, leaves[count:], create_graph=True, allow_unused=True,
                          materialize_grads=True)
        self.leaves, self.firsts = leaves, firsts
        return tuple(f.detach() for f in firsts) if len(firsts) > 1 else firsts[0].detach()

    def backward(self, *grads):
        from .engine import grad

        if self._create_graph:
            raise RuntimeError("double backward of this op's recomputed gradient cannot be differentiated again "
                               "(third order)\nHINT: second derivatives (gradient penalties, Hessian-vector "
                               "products) are supported; higher orders are not")
        used = [(f, g) for f, g in zip(self.firsts, grads) if g is not None]
        differentiable = [leaf for leaf in self.leaves if leaf.requires_grad]
        if not used or not differentiable:
            return tuple(None for _ in self.leaves)
        got = iter(grad([f for f, _ in used], differentiable, [g for _, g in used], allow_unused=True,
                        materialize_grads=True))
        return tuple(next(got) if leaf.requires_grad else None for leaf in self.leaves)


def _leaf(t):
    """A detached copy of ``t`` that takes gradients (floating tensors) for the private graph."""
    leaf = t.detach()
    return leaf.requires_grad_(True) if backend.is_floating(leaf.dtype) else leaf


class LinearAdjoint(Op):
    """``g -> backward(g)`` of an op that is linear in one input, as an op: forward runs the op's numeric
    backward, and its own backward applies the op's forward map (``forward_map``, on Tensors, recorded) to the
    gradient it receives. Its value does not depend on the op's inputs, so they get no second-order term."""

    def __init__(self, backward_array, forward_map):
        self.backward_array, self.forward_map = backward_array, forward_map

    def forward(self, g):
        return self.backward_array(g)

    def backward(self, gg):
        from .grad_mode import no_grad

        with no_grad():
            return self.forward_map(Tensor._make(gg, self.device)).array

    def backward_graph(self, gg):
        return self.forward_map(gg)


__all__ = ["recomputed_grads", "LinearAdjoint", "graph_handle"]
