"""Expert parallelism in a layout plan (``parallel.expert: E``): the experts of every MoE layer split over groups of E
consecutive data-parallel ranks (distributed/expert_groups.py), alone or with data parallelism over the rest.

- split: the model is built on the meta device (shapes only) and ``split`` keeps this rank's experts of every MoE
  layer (of this stage's chunks under pipeline parallelism) before anything is allocated; sharded initialisation
  then fills them with the one-process values, so a rank never holds the other ranks' experts;
- gradients: DDP averages the other parameters over the data-parallel group (the experts are its
  ``ignored_parameters``); after backward ``reduce_grads`` sums the experts' over the expert-data group and divides by
  the data-parallel size (under ZeRO 1 and 2 in the optimizer's expert spaces: ZeRO-2 reduce-scatters them into
  this rank's shard); under ZeRO-3 fully_shard keeps the experts sharded over the expert-data group within each
  block's unit and reduce-scatters their gradients, with the same divisor, at the end of backward (parallelize.py);
- clipping: the norm counts every expert once: the squared norm of the local experts' gradients summed over the
  expert group (``expert_group``), plus the replicated parameters', summed over the pipeline stages.

Checkpoints name the experts under their one-process names; ``whole_groups`` and ``whole_state_names`` keep the
one-process model's parameter names per optimizer group and its state-dict names for them.
"""
from __future__ import annotations

from ..distributed.expert_groups import expert_groups
from ..nn.parallel.expert_parallel import all_reduce_expert_grads, expert_parallel, expert_parameters


class ExpertLayout:
    """The expert groups of a layout and what they change: see the module docstring. ``dims``: the run's
    ParallelDims; ``expert``: the expert-parallel size E."""

    def __init__(self, dims, expert):
        self.dims, self.expert = dims, expert
        self.groups = expert_groups(dims.mesh if dims.mesh is not None else list(range(dims.world)), expert)
        self.model = self.whole_groups = self.whole_state_names = None
        self.expert_params = []

    @property
    def expert_group(self):
        return self.groups.expert_group

    def split(self, model, weight_decay):
        """Keep this rank's experts of every MoE layer of ``model`` (whole, or this stage's chunks), after recording
        the one-process model's parameter names per optimizer group."""
        self.whole_groups = getattr(model, "whole_groups", None) or whole_param_names(model, weight_decay)
        self.whole_state_names = getattr(model, "whole_state_names", None) or list(model.state_dict(keep_vars=True))
        for moe in model.moe_layers():
            expert_parallel(moe, self.groups.expert_group)
        self.model = model
        self.expert_params = expert_parameters(model)
        return model

    def reduce_grads(self, zero=None, shard=False, fully_sharded=False):
        """Average the local experts' gradients over the data-parallel ranks; under ZeRO (``zero``, the run's
        ZeroRedundancyOptimizer) in its expert spaces, reduce-scattered into this rank's shard with ``shard``;
        nothing when ``fully_sharded`` (ZeRO-3: fully_shard reduced them)."""
        if fully_sharded:
            return
        if zero is not None:
            zero.reduce_gradients(shard, spaces=zero.expert_spaces, divide_by=self.groups.data_size)
            return
        all_reduce_expert_grads(self.model, self.groups.expert_data_group, self.groups.data_size)


def parameter_names(model):
    """{id(parameter): its first name in ``model``}."""
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def whole_param_names(model, weight_decay):
    """The parameter names of each of the one-process model's optimizer groups (``model`` still whole)."""
    names = parameter_names(model)
    return [[names[id(p)] for p in g["params"]] for g in model.optimizer_groups(weight_decay)]


__all__ = ["ExpertLayout", "parameter_names", "whole_param_names"]
