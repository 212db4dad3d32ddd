"""Expert parallelism in a run (``parallel.expert: E``): the experts of every MoE layer split over groups of E
consecutive data-parallel ranks (distributed/expert_groups.py), alone or with data parallelism over the rest.

- build: the model is built on the meta device (shapes only) and ``split`` keeps this rank's experts of every MoE
  layer (of this stage's chunks under pipeline parallelism) before anything is allocated; sharded initialisation
  then fills them with the one-process values, so a rank never holds the other ranks' experts;
- gradients: DDP averages the other parameters over the data-parallel group (the experts are its
  ``ignored_parameters``); after backward ``all_reduce_expert_grads`` sums the experts' over the expert-data group
  and divides by the data-parallel size (``finish``);
- clipping: the norm counts every expert once: the squared norm of the local experts' gradients summed over the
  expert group, plus the replicated parameters', summed over the pipeline stages (``clip``);
- checkpoints: each rank's experts are entries under their one-process names (infini_train.run_state, from the
  ``whole_state_names`` and ``whole_groups`` that ``split`` records): a sharded checkpoint holds them as every rank
  wrote them, a whole one gathered; either resumes at any other E, one process included.

Under ZeRO 1 and 2 the optimizer shards the local experts' state over the expert-data group (its ``expert_spaces``;
distributed/optim/zero_redundancy_optimizer.py): ``finish`` averages their gradients there in its flat buffers
(ZeRO-2: reduce-scattered into this rank's shard), and its own clipping counts each expert once.
"""
from __future__ import annotations

from ..distributed.expert_groups import expert_groups
from ..nn.parallel.expert_parallel import all_reduce_expert_grads, expert_parallel, expert_parameters
from ..nn.parallel.grad_norm import clip_grad_norm_model_parallel_


class ExpertParallelRun:
    """The expert groups of a run and what they change: see the module docstring. ``dims``: the run's ParallelDims;
    ``split(model, weight_decay)`` then splits the experts of the model as built (on the meta device)."""

    def __init__(self, dims, expert):
        self.dims, self.expert = dims, expert
        self.groups = expert_groups(dims.mesh if dims.mesh is not None else list(range(dims.world)), expert)
        self.model = self.whole_groups = self.whole_state_names = None
        self.expert_params = []

    def split(self, model, weight_decay):
        """Keep this rank's experts of every MoE layer of ``model`` (whole, or this stage's chunks), after recording
        the one-process model's parameter names per optimizer group."""
        self.whole_groups = getattr(model, "whole_groups", None) or _whole_param_names(model, weight_decay)
        self.whole_state_names = getattr(model, "whole_state_names", None) or list(model.state_dict(keep_vars=True))
        for moe in model.moe_layers():
            expert_parallel(moe, self.groups.expert_group)
        self.model = model
        self.expert_params = expert_parameters(model)
        return model

    # ------------------------------------------------------------------------------------------- gradients
    def finish(self, zero=None, shard=False):
        """Average the local experts' gradients over the data-parallel ranks; under ZeRO (``zero``, the run's
        ZeroRedundancyOptimizer) in its expert spaces, reduce-scattered into this rank's shard with ``shard``."""
        if zero is not None:
            zero.reduce_gradients(shard, spaces=zero.expert_spaces, divide_by=self.groups.data_size)
            return
        all_reduce_expert_grads(self.model, self.groups.expert_data_group, self.groups.data_size)

    def clip(self, max_norm):
        """Clip by the one-process model's gradient norm (each expert counted once, summed over the stages of a
        pipeline); returns it as a float."""
        dims = self.dims
        return float(clip_grad_norm_model_parallel_(list(self.model.parameters()), max_norm, dims.tp_group,
                                                    dims.pp_group, expert_group=self.groups.expert_group).item())


def _names(model):
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def _whole_param_names(model, weight_decay):
    """The parameter names of each of the one-process model's optimizer groups (``model`` still whole)."""
    names = _names(model)
    return [[names[id(p)] for p in g["params"]] for g in model.optimizer_groups(weight_decay)]


__all__ = ["ExpertParallelRun"]
