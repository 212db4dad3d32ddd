"""Whole-format checkpoints of an expert-parallel run (``parallel.expert: E``; the layout itself is
models/expert_layout.py). Sharded checkpoints need nothing more: each rank writes its experts under their
one-process names (training/sharded_state.py). The whole format: ``gather`` gathers every expert (weights and AdamW
moments) over rank 0's expert group under its one-process names and index (expert and data parallelism only);
``scatter`` keeps this rank's experts of a whole state (and its tensor-parallel shards of them), so a checkpoint
written at any E resumes at any other E, one process included. Under ZeRO 1 and 2 ``gather`` reads every local
expert's state whole from the optimizer's expert spaces (gathered over the expert-data group first).
"""
from __future__ import annotations

import copy

import numpy as np

from ..models.expert_layout import parameter_names
from ..nn.parallel.expert_parallel import expert_layers, expert_stem, shard_expert_state_dict, whole_expert_state_dict
from ..nn.parallel.whole_state import load_whole_state_dict, shard_optimizer_state
from ..tensor import Tensor
from .state_io import StateIO


class ExpertState(StateIO):
    """Whole (one-process) state of an expert-parallel run: experts gathered on save, kept on load. ``experts``: the
    plan's ExpertLayout (models/expert_layout.py)."""

    def __init__(self, dims, model, optimizer, zero_stage, experts):
        super().__init__(dims, model, optimizer, zero_stage)
        self.experts = experts
        self.groups, self.expert = experts.groups, experts.expert
        self.whole_groups = experts.whole_groups

    # ------------------------------------------------------------------------------------------ checkpoints
    def gather(self):
        """(model state, optimizer state) in the one-process layout on rank 0, (None, None) elsewhere (collective
        over every expert group; under ZeRO the optimizer's state is gathered whole first)."""
        optimizer, zero = self.optimizer, bool(self.zero_stage)
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
        names = parameter_names(self.model)
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
        """Load a whole (one-process) state: each rank keeps its experts (and their optimizer state). Under tensor
        parallelism each rank then slices its shards of the split tensors (and of their AdamW moments)."""
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
        names = parameter_names(self.model)
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


def _copy(st, device):
    return {k: (Tensor._make(v.copy(), device) if hasattr(v, "shape") else v)
            for k, v in st.items() if not k.startswith("_")}


__all__ = ["ExpertState"]
