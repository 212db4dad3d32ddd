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
- checkpoints: sharded by default (each rank writes its experts under their one-process names:
  training/sharded_state.py), or whole: ``gather`` gathers every expert (weights and AdamW moments) over rank 0's
  expert group under its one-process names and index (expert and data parallelism only); ``scatter`` keeps this
  rank's experts of a whole state (and its tensor-parallel shards of them), so a checkpoint written at any E resumes
  at any other E, one process included.

Under ZeRO 1 and 2 the optimizer shards the local experts' state over the expert-data group (its ``expert_spaces``;
distributed/optim/zero_redundancy_optimizer.py): ``finish`` averages their gradients there in its flat buffers
(ZeRO-2: reduce-scattered into this rank's shard), its own clipping counts each expert once, and ``gather`` reads
every local expert's state whole from it (gathered over the expert-data group first).
"""
from __future__ import annotations

import copy

import numpy as np

from ..distributed.expert_groups import expert_groups
from ..nn.parallel.expert_parallel import (all_reduce_expert_grads, expert_layers, expert_parallel, expert_parameters,
                                           expert_stem, shard_expert_state_dict, whole_expert_state_dict)
from ..nn.parallel.grad_norm import clip_grad_norm_model_parallel_
from ..nn.parallel.whole_state import load_whole_state_dict, shard_optimizer_state
from ..tensor import Tensor
from .state_io import StateIO


class ExpertParallelRun:
    """The expert groups of a run and what they change: see the module docstring. ``dims``: the run's ParallelDims;
    ``split(model, weight_decay)`` then splits the experts of the model as built (on the meta device)."""

    def __init__(self, dims, expert):
        self.dims, self.expert = dims, expert
        self.groups = expert_groups(dims.mesh if dims.mesh is not None else list(range(dims.world)), expert)
        self.model = self.optimizer = self.whole_groups = self.whole_state_names = None
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

    # ------------------------------------------------------------------------------------------ checkpoints
    def gather(self, optimizer, zero=False):
        """(model state, optimizer state) in the one-process layout on rank 0, (None, None) elsewhere (collective
        over every expert group; ``zero``: ``optimizer`` is a ZeroRedundancyOptimizer, its state gathered whole
        first)."""
        group = self.groups.expert_group
        model_state = whole_expert_state_dict(self.model, group)
        if zero:  # (only rank 0's expert group's states are kept)
            states = optimizer.whole_states(build=self.dims.dp_rank < self.expert)
        else:
            states = {id(p): st for p, st in optimizer.state.items()}
        by_name = self._gather_optimizer_state(optimizer, states, group)
        if self.dims.rank != 0:
            return None, None
        index, groups = {}, []
        for options, names in zip(optimizer.param_groups, self.whole_groups):
            groups.append({**{k: copy.deepcopy(v) for k, v in options.items() if k != "params"},
                           "params": [index.setdefault(n, len(index)) for n in names]})
        state = {index[name]: st for name, st in by_name.items()}
        return model_state, {"state": state, "param_groups": groups}

    def _gather_optimizer_state(self, optimizer, states, group):
        """{parameter name: its AdamW state} of every parameter of the one-process model that has state: the
        replicated ones this rank's, the experts' gathered over the expert group. ``states``: {id(parameter): its
        state} on this rank."""
        names = _names(self.model)
        whole = optimizer.whole_param_groups
        local = {names[id(p)]: states.get(id(p)) for g in whole for p in g["params"]}
        params = {names[id(p)]: p for g in whole for p in g["params"]}
        out = {name: _copy(st, params[name].device) for name, st in local.items()
               if st and not any(name.startswith(stem) for stem in self._stems())}
        for prefix, moe in expert_layers(self.model):
            d, stem = moe.token_dispatcher, expert_stem(prefix)
            for slot, e in enumerate(d.local_experts):
                for key, p in moe.experts[str(e)].named_parameters():
                    st = states.get(id(p)) or {}
                    has = Tensor(np.array([1 if st else 0, st.get("step", 0) if st else 0], np.int64))
                    flags = [Tensor(np.zeros(2, np.int64)) for _ in range(d.size)]
                    group.all_gather(flags, has)
                    flags = [f.numpy() for f in flags]
                    gathered = {}
                    for k in ("exp_avg", "exp_avg_sq"):
                        if not any(f[0] for f in flags):
                            break
                        mine = st[k] if st else p.device.array_module().zeros_like(p.array)
                        mine = Tensor._make(mine.copy(), p.device)
                        parts = [Tensor._make(mine.array.copy(), p.device) for _ in range(d.size)]
                        group.all_gather(parts, mine)
                        gathered[k] = parts
                    for j, f in enumerate(flags):
                        if f[0]:
                            out[f"{stem}{j * d.num_local + slot}.{key}"] = {
                                "step": int(f[1]), **{k: v[j] for k, v in gathered.items()}}
        return out

    def _stems(self):
        return [expert_stem(prefix) for prefix, _ in expert_layers(self.model)]

    def scatter(self, model_state, optimizer_state):
        """Load a whole (one-process) state: each rank keeps its experts (and their optimizer state); the run's
        optimizer (over this rank's parameters) is ``self.optimizer``, set when it is built. Under tensor parallelism
        each rank then slices its shards of the split tensors (and of their AdamW moments)."""
        tp_group = self.dims.tp_group
        model_state = shard_expert_state_dict(self.model, model_state)
        if tp_group is not None:
            load_whole_state_dict(self.model, model_state, tp_group)
        else:
            self.model.load_state_dict(model_state)
        whole_names = {}
        for saved, names in zip(optimizer_state["param_groups"], self.whole_groups):
            whole_names.update(zip(saved["params"], names))
        by_name = {whole_names[i]: st for i, st in optimizer_state["state"].items()}
        names = _names(self.model)
        index, groups, state = {}, [], {}
        for saved, g in zip(optimizer_state["param_groups"], self.optimizer.whole_param_groups):
            groups.append({**{k: v for k, v in saved.items() if k != "params"},
                           "params": [index.setdefault(id(p), len(index)) for p in g["params"]]})
            for p in g["params"]:
                if names[id(p)] in by_name:
                    state[index[id(p)]] = by_name[names[id(p)]]
        local = {"state": state, "param_groups": groups}
        if tp_group is not None:
            local = shard_optimizer_state(local, self.optimizer, tp_group)
        self.optimizer.load_state_dict(local)


def _names(model):
    names = {}
    for name, p in model.named_parameters():
        names.setdefault(id(p), name)
    return names


def _copy(st, device):
    return {k: (Tensor._make(v.copy(), device) if hasattr(v, "shape") else v)
            for k, v in st.items() if not k.startswith("_")}


def _whole_param_names(model, weight_decay):
    """The parameter names of each of the one-process model's optimizer groups (``model`` still whole)."""
    names = _names(model)
    return [[names[id(p)] for p in g["params"]] for g in model.optimizer_groups(weight_decay)]


class ExpertState(StateIO):
    """Whole (one-process) state of an expert-parallel run: experts gathered on save, kept on load."""

    def __init__(self, dims, model, optimizer, zero_stage, experts):
        super().__init__(dims, model, optimizer, zero_stage)
        self.experts = experts
        experts.optimizer = optimizer

    def gather(self):
        return self.experts.gather(self.optimizer, zero=bool(self.zero_stage))

    def scatter(self, model_state, optimizer_state):
        self.experts.scatter(model_state, optimizer_state)


__all__ = ["ExpertParallelRun", "ExpertState"]
