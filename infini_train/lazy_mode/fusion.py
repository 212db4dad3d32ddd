"""Element-wise fusion for lazy mode: a chain of element-wise ops evaluated in one pass over memory.

The rule: a recorded element-wise node joins the group of its consumers when it records no autograd graph (grad
off, or no input requires grad: a recorded node would save intermediates for backward anyway), nothing
references its result (its placeholder is gone and it is no realisation target), every consumer still alive is
in that same group, and its shape is the group's shape (a smaller operand, e.g. a bias, is computed on its own
and broadcast in). Groups of two or more nodes whose output has at least ``MIN_ELEMENTS`` elements are fused.

A fused group runs block by block: the output is cut into C-order blocks of ``BLOCK`` elements (``GPU_BLOCK`` on
cupy) and the whole chain runs on each block with small temporaries, so the large intermediates never exist. Each
node's own ``forward`` runs on the blocks: the same ufuncs in the same order on the same dtypes, so every element
equals eager mode's bit for bit (0-d operands stay 0-d and others keep their number of dimensions, so type
promotion sees the same operands; groups with a non-C-contiguous full-size input run node by node, since eager
results would keep that layout). A single generated GPU kernel (cupy.fuse / ElementwiseKernel) is not used: the
compiler contracts a * b + c into fused multiply-adds across ops, which changes the last bit versus eager mode.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from ..autograd.ops import activations, conversion, elementwise, logic

BLOCK = 1 << 15  # elements per block: 128 KiB of float32, so a chain's temporaries stay in cache
GPU_BLOCK = 1 << 22  # on cupy: blocks large enough to fill the GPU, small next to a whole activation
MIN_ELEMENTS = 1 << 16  # smaller outputs run node by node (the block loop's overhead would dominate)

ELEMENTWISE = {
    elementwise.Add, elementwise.Sub, elementwise.Mul, elementwise.Div, elementwise.RoundedDiv,
    elementwise.FloorDivide, elementwise.Remainder, elementwise.Pow, elementwise.Neg, elementwise.Exp,
    elementwise.Log, elementwise.Tanh, elementwise.Sqrt, elementwise.Rsqrt, elementwise.Sin, elementwise.Cos,
    elementwise.Abs, elementwise.Reciprocal, elementwise.Clamp, elementwise.Maximum, elementwise.Minimum,
    elementwise.Where, activations.Sigmoid, activations.ReLU, activations.GELU, activations.NormalCdf,
    activations.SiLU, activations.Softplus, conversion.Cast, logic.Eq, logic.Ne, logic.Lt, logic.Le, logic.Gt,
    logic.Ge, logic.LogicalAnd, logic.LogicalOr, logic.LogicalXor, logic.LogicalNot, logic.BitwiseAnd,
    logic.BitwiseOr, logic.BitwiseXor, logic.BitwiseNot, logic.LeftShift, logic.RightShift, logic.IsFinite,
    logic.IsNan, logic.IsInf,
}

stats = {"groups": 0, "fused_nodes": 0, "blocks": 0}  # counters since the last reset_stats()


def reset_stats():
    for key in stats:
        stats[key] = 0


def fusion_stats():
    """How many groups were fused, how many nodes they held and how many blocks ran."""
    return dict(stats)


def _stand_in(shape, dtype):
    """A 1-element array with ``shape``'s number of dimensions (0-d stays 0-d: promotion depends on it)."""
    return np.zeros((1,) * len(shape), dtype)


def infer_meta(fn, inputs):
    """((shape, dtype),) of an element-wise op's output, without computing it: the broadcast shape, and the
    dtype of its forward on 1-element stand-ins. None when the inputs do not fit (eager mode raises then)."""
    from .graph import LazyTensor
    from ..tensor import Tensor
    shapes = []
    args = []
    for t in inputs:
        if t.__class__ is LazyTensor:
            meta = t._meta()
            if meta is None:
                return None
            shapes.append(meta[0])
            args.append(_stand_in(*meta))
        elif isinstance(t, Tensor):
            shapes.append(t.shape)
            args.append(_stand_in(t.shape, t.dtype))
        else:
            args.append(t)
    saved = fn.xp, fn.device, fn._stash
    try:
        shape = np.broadcast_shapes(*shapes)
        fn.xp = np
        with np.errstate(all="ignore"):
            out = fn.forward(*args)
        dtype = np.asarray(out).dtype
    except Exception:  # noqa: BLE001 - any failure means: let eager mode raise its own error
        return None
    finally:
        fn.xp, fn.device, fn._stash = saved
    return ((tuple(shape), dtype),)


class Group:
    """Nodes computed in one pass; ``root`` (the last in topological order) is the only output."""

    __slots__ = ("root", "shape", "nodes")

    def __init__(self, root):
        self.root = root
        self.shape = root.meta[0][0]
        self.nodes = [root]


def _fusible(node):
    if node.record is not False or node.meta is None or type(node.fn) not in ELEMENTWISE:
        return False
    shape = node.meta[0][0]
    return len(shape) > 0 and math.prod(shape) >= MIN_ELEMENTS


def plan(order, targets):
    """Steps for realising ``order`` (producers first): ("node", node) or ("group", Group)."""
    target_ids = {id(n) for n in targets}
    group_of = {}
    for node in reversed(order):  # consumers first
        if not _fusible(node):
            continue
        group = None
        if id(node) not in target_ids and node.outputs[0]() is None:
            consumers = [c for ref in node.consumers if (c := ref()) is not None and not c.done]
            groups = {id(group_of.get(id(c))) for c in consumers}
            if consumers and len(groups) == 1 and id(consumers[0]) in group_of:
                candidate = group_of[id(consumers[0])]
                if candidate.shape == node.meta[0][0]:
                    group = candidate
        if group is None:
            group = Group(node)
        else:
            group.nodes.append(node)
        group_of[id(node)] = group
    steps = []
    for node in order:
        group = group_of.get(id(node))
        if group is None or len(group.nodes) == 1:
            steps.append(("node", node))
        elif group.root is node:
            group.nodes.reverse()  # producers first
            steps.append(("group", group))
    return steps


def _operand(a, members, ndim):
    """A group input as ("node", position) for members, or the array/scalar (padded to ``ndim`` dims)."""
    from .graph import _In
    from ..tensor import Tensor
    if a.__class__ is _In:
        pos = members.get(id(a.node))
        if pos is not None:
            return ("node", pos)
        a = a.value()
    if isinstance(a, Tensor):
        arr = a.array
        if 0 < arr.ndim < ndim:
            arr = arr.reshape((1,) * (ndim - arr.ndim) + arr.shape)
        return ("array", arr)
    return ("const", a)


def run_group(group, run_node, finish):
    """Compute a fused group, or node by node when its inputs do not suit a fused pass."""
    members = {id(n): i for i, n in enumerate(group.nodes)}
    ndim = len(group.shape)
    program = [[_operand(a, members, ndim) for a in node.inputs] for node in group.nodes]
    device = group.root.device
    arrays = [v for ops in program for kind, v in ops if kind == "array"]
    full = [a for a in arrays if a.shape == group.shape]
    xp = device.xp if device.xp is not None else device.array_module()
    if not all(a.flags.c_contiguous for a in full):  # eager results would keep the inputs' layout
        return _one_by_one(group, run_node)
    if device.type == "cuda":
        with device.context():
            out = _run_blocks(group, program, xp, device, GPU_BLOCK)
    else:
        out = _run_blocks(group, program, xp, device, BLOCK)
    from ..tensor import Tensor
    for node in group.nodes[:-1]:
        finish(node, (None,))
    finish(group.root, (Tensor._make(out, device),))
    stats["groups"] += 1
    stats["fused_nodes"] += len(group.nodes)


def _one_by_one(group, run_node):
    for node in group.nodes:
        run_node(node)


def _blocks(shape, block):
    """Index tuples covering ``shape`` in C order, each about ``block`` elements (slices keep every dimension)."""
    ndim = len(shape)
    axis = ndim - 1
    inner = 1
    while axis > 0 and inner * shape[axis] <= block:
        inner *= shape[axis]
        axis -= 1
    step = max(1, block // inner)  # inner <= block; the whole array is one block when it is small
    for lead in itertools.product(*[range(n) for n in shape[:axis]]):
        head = tuple(slice(i, i + 1) for i in lead)
        for start in range(0, shape[axis], step):
            yield head + (slice(start, min(start + step, shape[axis])),)


def _sub(arr, index):
    """The part of ``arr`` (broadcastable, same ndim) that meets the block ``index``."""
    return arr[tuple(s if n != 1 else slice(None) for s, n in zip(index, arr.shape))]


def _run_blocks(group, program, xp, device, block):
    nodes = group.nodes
    fns = [n.fn for n in nodes]
    for fn in fns:
        fn.xp, fn.device = xp, device
    out = None
    for index in _blocks(group.shape, block):
        values = []
        for fn, ops in zip(fns, program):
            args = []
            for kind, v in ops:
                if kind == "node":
                    args.append(values[v])
                elif kind == "array":
                    args.append(_sub(v, index) if v.ndim else v)
                else:
                    args.append(v)
            values.append(fn.forward(*args))
        last = values[-1]
        if out is None:
            out = xp.empty(group.shape, last.dtype)
        out[index] = last
        stats["blocks"] += 1
    for fn in fns:
        fn._stash = None  # stashes of blocks (Pow, GELU) are meaningless: these nodes record no backward
    return out
