"""A run's model and optimizer state as sharded checkpoint entries (it.distributed.checkpoint): every rank names the
pieces of the whole tensors it holds, in whatever layout it runs, so a checkpoint is written with no gather and
loads under any other layout.

Entries: ``model/<name>`` for each state-dict entry (a LoRA run: the adapters only), ``optimizer/<parameter
name>/<key>`` for each array of a parameter's optimizer state, and ``optimizer/<parameter name>/step`` (0-d).
Tensor-parallel shards are their ShardSpec's boxes, ZeRO's pieces flat ranges of them, pipeline stages hold their
own names, expert-parallel ranks their experts (whole, under the one-process names); the param groups (options and
parameter names, the whole model's) go into state.json.
"""
from __future__ import annotations

import numpy as np

from ..distributed import checkpoint as dcp
from ..nn.lora import lora_state_dict
from ..nn.parallel.sharded_pieces import flat_pieces, param_pieces, tensor_pieces
from .state_tree import flatten_state, unflatten_state


OPTIMIZER = "optimizer/"


class ShardedState:
    def __init__(self, dims, model, optimizer, zero_stage, lora):
        self.dims, self.model, self.optimizer = dims, model, optimizer
        self.zero = optimizer if zero_stage else None
        self.lora = lora
        self.tp_rank = dims.tp_rank if dims.tensor_parallel else 0
        self.tp_size = dims.tp_size
        self.experts = None  # an ExpertParallelRun: this rank holds some experts, state.json names every one

    # --------------------------------------------------------------------------------------------- names
    def _model_tensors(self):
        state = self.model.state_dict(keep_vars=True)
        if self.lora:
            keep = set(lora_state_dict(self.model))
            state = {k: v for k, v in state.items() if k in keep}
        return state

    def model_keys(self):
        """The model's state-dict names in the whole model's order (for state.json)."""
        if self.experts is not None:
            return list(self.experts.whole_state_names)
        if self.dims.pipeline_parallel:
            return list(self.model.whole_state_names)
        return list(self._model_tensors())

    def _param_names(self):
        if self.dims.pipeline_parallel:
            return self.model.canonical_names()
        names = {}
        for name, p in self.model.named_parameters():
            names.setdefault(id(p), name)
        return names

    def param_groups(self):
        """The optimizer's param groups as the whole model's: options and parameter names (for state.json)."""
        if self.experts is not None:
            names = self.experts.whole_groups
        elif self.dims.pipeline_parallel:
            names = self.model.whole_groups
        else:
            of = self._param_names()
            names = [[of[id(p)] for p in g["params"]] for g in self.optimizer.whole_param_groups]
        options = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        return [{"options": flatten_state(opts)[1], "params": list(group)} for opts, group in zip(options, names)]

    def _model_pieces(self, t):
        """The pieces of a state-dict entry this rank holds (a fully_shard parameter: its flat piece)."""
        return param_pieces(t, self.tp_rank, self.tp_size)

    def _pieces(self, array, p):
        return tensor_pieces(array, getattr(p, "tp_spec", None), self.tp_rank, self.tp_size)

    # ---------------------------------------------------------------------------------------------- save
    def entries(self):
        """{entry name: LocalPieces} of what this rank holds now."""
        out = {}
        for name, t in self._model_tensors().items():
            out[f"model/{name}"] = self._model_pieces(t)
        names = self._param_names()
        for holder, p, start, length in self._state_holders():
            state = (self.zero.optim if self.zero is not None else self.optimizer).state.get(holder) or {}
            for key, value in state.items():
                entry = f"{OPTIMIZER}{names[id(p)]}/{key}"
                if getattr(value, "ndim", 0):
                    out[entry] = self._state_pieces(value, p, start, length)
                elif not key.startswith("_"):
                    out[entry] = dcp.LocalPieces.whole(np.array(value))
        return out

    def _state_holders(self):
        """(tensor the optimizer keeps state for, its parameter, first flat element, element count): a ZeRO
        piece (a flat range of the parameter's shard) or, without ZeRO, the parameter itself (count None)."""
        if self.zero is not None:
            return [(view, p, a, b - a) for view, _, p, _, a, b in self.zero.pieces]
        return [(p, p, 0, None) for g in self.optimizer.param_groups for p in g["params"]]

    def _state_pieces(self, array, p, start, length):
        """The pieces of the whole state tensor of ``p`` that ``array`` (a holder's state) covers."""
        if length is None:
            return self._pieces(array, p)
        return flat_pieces(tuple(p.shape), array, start, getattr(p, "tp_spec", None), self.tp_rank, self.tp_size)

    def save(self, directory, group=None):
        """Write this rank's entries into ``directory`` (collective); returns the checkpoint's metadata."""
        return dcp.save(self.entries(), directory, group)

    # ---------------------------------------------------------------------------------------------- load
    def load(self, directory, param_groups):
        """Fill the model and optimizer from the sharded checkpoint in ``directory``; ``param_groups``: the
        groups its state.json recorded (options and names)."""
        metadata = dcp.read_metadata(directory)
        targets = {f"model/{name}": self._model_pieces(t) for name, t in self._model_tensors().items()}
        dcp.load(targets, directory, metadata=metadata)
        names = self._param_names()
        saved_keys = {}  # parameter name -> [(state key, entry, entry info)]
        for entry, name, key, info in optimizer_entries(metadata["tensors"]):
            saved_keys.setdefault(name, []).append((key, entry, info))
        filled = {}  # (id of the tensor holding the state, key) -> array filled from the checkpoint
        batches = [{}]  # one dcp.load per batch; a tied weight's copy asks for an entry a second time
        for holder, p, start, length in self._state_holders():
            for key, entry, info in saved_keys.get(names[id(p)], ()):
                if info["shape"]:
                    array = np.zeros(length if length is not None else tuple(p.shape), _dtype(info["dtype"]))
                    pieces = self._state_pieces(array, p, start, length)
                else:
                    array = np.zeros((), _dtype(info["dtype"]))
                    pieces = dcp.LocalPieces.whole(array)
                batch = next((b for b in batches if entry not in b), None)
                if batch is None:
                    batch = {}
                    batches.append(batch)
                batch[entry] = pieces
                filled[(id(holder), key)] = array
        for batch in batches:
            dcp.load(batch, directory, metadata=metadata)
        self._load_optimizer(filled, param_groups)

    def _load_optimizer(self, filled, param_groups):
        optimizer = self.zero.optim if self.zero is not None else self.optimizer
        index = {}
        groups = []
        for g, saved in zip(optimizer.param_groups, param_groups):
            packed = group_options(saved)
            packed["params"] = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append(packed)
        state = {}
        for (holder_id, key), array in filled.items():
            entry = state.setdefault(index[holder_id], {})
            entry[key] = int(array) if array.ndim == 0 else array
        optimizer.load_state_dict({"state": state, "param_groups": groups})


def whole_state(path, state, model_only=False):
    """(model state {name: array}, optimizer state in torch's layout or None) of a sharded checkpoint, assembled
    whole in this process; ``state``: its parsed state.json."""
    metadata = dcp.read_metadata(path)
    tensors = metadata["tensors"]
    wanted = {e: info for e, info in tensors.items() if not (model_only and e.startswith(OPTIMIZER))}
    arrays = {entry: np.zeros(tuple(info["shape"]), _dtype(info["dtype"])) for entry, info in wanted.items()}
    dcp.load(arrays, path, metadata=metadata)
    model_state = {e[len("model/"):]: a for e, a in sorted(arrays.items()) if e.startswith("model/")}  # by name,
    # as a whole checkpoint's model file gives them
    if model_only:
        return model_state, None
    index, groups = whole_param_groups(state["optimizer"]["param_groups"])
    per_param = {}
    for entry, name, key, _ in optimizer_entries(tensors):
        array = arrays[entry]
        per_param.setdefault(index[name], {})[key] = int(array) if array.ndim == 0 else array
    return model_state, {"state": per_param, "param_groups": groups}


def optimizer_entries(tensors):
    """(entry, parameter name, state key, entry info) of each optimizer entry of a sharded checkpoint's tensors."""
    for entry, info in tensors.items():
        if entry.startswith(OPTIMIZER):
            name, _, key = entry[len(OPTIMIZER):].rpartition("/")
            yield entry, name, key, info


def whole_param_groups(saved_groups):
    """({parameter name: index}, param groups in torch's layout) from state.json's record of the param groups:
    the parameters numbered across groups in order, as a whole optimizer state dict numbers them."""
    index, groups = {}, []
    for group in saved_groups:
        groups.append({**group_options(group), "params": [index.setdefault(n, len(index)) for n in group["params"]]})
    return index, groups


def _dtype(code):
    from ..safetensors_io import _numpy_dtype

    return np.dtype(_numpy_dtype(code, "checkpoint", "entry"))


def group_options(saved_group):
    """A param group's options as the optimizer had them (tuples kept), from state.json's record of it."""
    return unflatten_state(saved_group["options"], {})


__all__ = ["ShardedState", "group_options", "whole_state", "optimizer_entries", "whole_param_groups"]
