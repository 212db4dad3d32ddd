"""Autograd: Function nodes, the backward engine, grad mode, AccumulateGrad and activation recomputation
(checkpoint); the op families are in ops/."""
from .accumulate import AccumulateGrad, PostAccumulateGradHook
from .engine import backward, grad
from .function import Function, Op, OpError, sum_to
from .hooks import RemovableHandle
from .grad_mode import (enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
                        set_grad_enabled)
from .recompute import checkpoint, checkpoint_sequential
from .saved_hooks import saved_tensors_hooks
from .split_backward import WeightGradients, backward_input
from . import graph  # it.autograd.graph.to_dot / render: the graph as Graphviz DOT
from .ops import comm  # it.autograd.comm.Scatter / Gather / Broadcast / ReduceAddCoalesced

__all__ = [
    "AccumulateGrad", "AllReducePostAccumulateHook", "PostAccumulateGradHook", "backward", "grad", "Function", "Op",
    "OpError", "RemovableHandle", "sum_to", "enable_grad", "inference_mode", "is_grad_enabled",
    "is_inference_mode_enabled", "no_grad", "set_grad_enabled", "checkpoint", "checkpoint_sequential",
    "saved_tensors_hooks", "backward_input", "WeightGradients",
]


def __getattr__(name):
    """``it.autograd.AllReducePostAccumulateHook`` (the contract's name) lives in distributed/, which this layer does
    not import: it is looked up there on first use."""
    if name == "AllReducePostAccumulateHook":
        from ..distributed.grad_hooks import AllReducePostAccumulateHook
        return AllReducePostAccumulateHook
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
