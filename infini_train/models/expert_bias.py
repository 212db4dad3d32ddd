"""The auxiliary-loss-free balance's bias update (DeepSeek-V3 sec. 2.1.2), one step of the gradient finaliser
(finalize_grads.py), as Megatron-Core's ``_update_router_expert_bias`` runs in its ``finalize_model_grads``.

Every ``DeepSeekMoE`` layer (nn/moe_routing.py) of this rank's model whose router has a ``bias_update_rate`` counted,
over the step's training forwards (every micro-batch), the assignments each expert processed for this rank's tokens
(``expert_load``). Once per step, after backward: the loads of every such layer, stacked, are summed over the
data-parallel ranks (times the context ranks: the ``grad_group``; expert parallelism splits the data ranks, and each
rank counts its own tokens, so this covers every token of the global batch) and, under sequence parallelism, over the
tensor group (each rank routed its slice of the sequence; without it the tensor ranks route the same tokens, and one
copy is the sum); then ``e_score_correction_bias += rate * sign(mean load - load)`` per layer and the loads restart.
Every rank applies the same update to the same bias, so the biases stay equal on every rank; pipeline stages update
their own layers. The bias is a persistent buffer: checkpoints save, load and reshard it with the model's state; the
optimizer never sees it. As in Megatron, the update runs whether or not the optimizer step is then skipped."""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import distributed as dist
from ..nn.moe_routing import DeepSeekMoE, updated_expert_bias
from ..tensor import Tensor


def bias_balanced_layers(model):
    """The DeepSeekMoE layers of ``model`` (a causal LM, or a pipeline stage's chunks) in module order."""
    return [m for m in model.modules() if isinstance(m, DeepSeekMoE)]


def summed_loads(loads, dims):
    """(layers, experts) int64 loads summed over the data x context ranks and, with sequence parallelism, the tensor
    ranks (every rank of a pipeline stage gets the same)."""
    if dims is None or (dims.grad_size == 1 and not dims.sequence_parallel):
        return loads
    total = Tensor(loads.astype(np.float64))  # (exact: counts far below 2**53)
    if dims.grad_size > 1:
        dist.all_reduce(total, "sum", group=dims.grad_group)
    if dims.sequence_parallel:
        dist.all_reduce(total, "sum", group=dims.tp_group)
    return total.numpy()


def update_expert_biases(model, dims=None):
    """Apply the step's bias update to every bias-balanced layer of ``model`` (see the module docstring; ``dims``: the
    run's ParallelDims, None in one process) and restart the loads. Returns the loads it used ((layers, experts);
    None when no layer updates its bias)."""
    layers = bias_balanced_layers(model)
    updating = [m for m in layers if m.gate.bias_update_rate]
    loads = None
    if updating:
        loads = summed_loads(np.stack([m.expert_load for m in updating]), dims)
        for moe, load in zip(updating, loads):
            bias = moe.gate.e_score_correction_bias
            new = updated_expert_bias(backend.to_device_array(bias.array, backend.CPU), load,
                                      moe.gate.bias_update_rate)
            bias.array[...] = backend.to_device_array(new, bias.device)
            bias._version[0] += 1
    for moe in layers:
        moe.expert_load[...] = 0
    return loads


__all__ = ["update_expert_biases", "bias_balanced_layers", "summed_loads"]
