"""Optimizer base: parameter groups with per-group options, per-parameter state, state_dict round trips."""
from __future__ import annotations

import copy

import numpy as np

from ..tensor import Tensor


class Optimizer:
    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.state = {}  # id(param) -> dict
        self.param_groups = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group):
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown param group option(s) {sorted(unknown)}; expected "
                             f"{sorted(self.defaults)}")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter appears in more than one param group")
            if not p.requires_grad:
                raise ValueError(f"{type(self).__name__}: can't optimize a tensor that does not require grad")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.array.fill(0)

    def step(self):
        raise NotImplementedError

    def _state_for(self, p):
        return self.state.setdefault(id(p), {})

    def state_dict(self):
        """torch's layout: {"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}."""
        index = {}
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append(packed)
        state = {}
        for g in self.param_groups:
            for p in g["params"]:
                if id(p) in self.state:
                    state[index[id(p)]] = {k: (v.copy() if hasattr(v, "copy") else v)
                                           for k, v in self.state[id(p)].items()}
        return {"state": state, "param_groups": copy.deepcopy(groups)}

    def load_state_dict(self, state_dict):
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"{type(self).__name__}.load_state_dict: the saved param groups "
                             f"({[len(g['params']) for g in groups]} params) do not match this optimizer's "
                             f"({[len(g['params']) for g in self.param_groups]})")
        by_index = {}
        for saved, group in zip(groups, self.param_groups):
            for i, p in zip(saved["params"], group["params"]):
                by_index[int(i)] = p
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) and isinstance(group.get(k), tuple) else v
        self.state = {}
        for i, st in state_dict["state"].items():
            p = by_index[int(i)]
            xp = p.device.array_module()
            restored = {}
            for k, v in st.items():
                if isinstance(v, Tensor):
                    v = v.array
                if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
                    v = xp.array(v, dtype=p.dtype if v.dtype.kind == "f" else v.dtype, copy=True)
                restored[k] = v
            self.state[id(p)] = restored
