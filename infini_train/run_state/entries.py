"""A run's model and optimizer state as named entries, each with its placement: every rank names the pieces of the
one-process model's tensors it holds, in whatever layout it runs, so its state is written with no gather and read
back under any other layout (it.distributed.checkpoint's LocalPieces).

Entries: ``model/<name>`` for each state-dict entry (a LoRA run: the adapters only), ``optimizer/<parameter
name>/<key>`` for each array of a parameter's optimizer state and ``optimizer/<parameter name>/step`` (0-d).
Placements: a whole tensor is one box; a tensor-parallel shard the boxes of its ShardSpec; a ZeRO piece (or a
fully_shard parameter's) a flat range of the rank's shard; a pipeline stage holds its own names (the last stage's
copy of a tied embedding under the embedding's name); an expert-parallel rank its experts, under their one-process
names; a LoRA run its adapters. Names are the one-process model's: ``WholeNames`` carries them for the layouts whose
ranks see a part of the model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import backend
from ..distributed import checkpoint as dcp
from ..nn.lora import lora_state_dict
from ..nn.parallel.sharded_pieces import flat_pieces, param_pieces, tensor_pieces
from ..optim.param_groups import numbering, packed_groups
from ..safetensors_io import numpy_dtype
from . import param_groups

MODEL = "model/"
OPTIMIZER = "optimizer/"


@dataclass
class WholeNames:
    """The one-process model's names where a rank holds part of it: ``state_names``, its state-dict names in order;
    ``group_names``, the parameter names of each of its optimizer's param groups; ``param_names`` ({id(parameter):
    name}, None: the model's own ``named_parameters``), e.g. a pipeline stage's copy of a tied weight under the
    original's name."""

    state_names: list
    group_names: list
    param_names: dict = None


def optimizer_entry(name, key):
    return f"{OPTIMIZER}{name}/{key}"


def optimizer_entries(tensors):
    """(entry, parameter name, state key, entry info) of each optimizer entry of a checkpoint's {entry: info}."""
    for entry, info in tensors.items():
        if entry.startswith(OPTIMIZER):
            name, _, key = entry[len(OPTIMIZER):].rpartition("/")
            yield entry, name, key, info


def entry_dtype(code):
    return np.dtype(numpy_dtype(code, "checkpoint", "entry"))


class RunEntries:
    """The entries this rank holds of ``model`` (unwrapped: a PipelinedLM for pipeline stages) and ``optimizer``
    (the run's: a ZeroRedundancyOptimizer under ZeRO, ``zero``); ``tp_rank``/``tp_size`` place tensor-parallel
    shards, ``lora``: only the adapters are the model's state, ``whole``: the WholeNames of a layout whose ranks hold
    part of the model (None: the model's own)."""

    def __init__(self, model, optimizer, tp_rank=0, tp_size=1, zero=False, lora=False, whole=None):
        self.model, self.optimizer, self.zero, self.lora = model, optimizer, zero, lora
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.whole = whole
        self.inner = optimizer.optim if zero else optimizer  # the optimizer that keeps per-tensor state

    # --------------------------------------------------------------------------------------------- names
    def model_tensors(self):
        state = self.model.state_dict(keep_vars=True)
        if self.lora:
            keep = set(lora_state_dict(self.model))
            state = {k: v for k, v in state.items() if k in keep}
        return state

    def model_keys(self):
        """The model's state-dict names in the whole model's order."""
        return list(self.whole.state_names) if self.whole is not None else list(self.model_tensors())

    def param_names(self):
        """{id(parameter): its name in the whole model} (a fully_shard parameter's ShardView, which a plain optimizer
        steps, named as its parameter)."""
        if self.whole is not None and self.whole.param_names is not None:
            names = dict(self.whole.param_names)
        else:
            names = {}
            for name, p in self.model.named_parameters():
                names.setdefault(id(p), name)
        for view_id, p in self.stepped().items():
            names.setdefault(view_id, names[id(p)])
        return names

    def stepped(self):
        """{id(ShardView): parameter} of the model's fully_shard parameters (their views, stepped by an optimizer
        without ZeRO)."""
        out = {}
        for p in self.model.parameters():
            flat_shard = p.placement.flat_shard
            if flat_shard is not None:
                out[id(flat_shard.shard_views[id(p)])] = p
        return out

    def group_names(self):
        """The parameter names of each of the whole model's optimizer param groups."""
        if self.whole is not None:
            return [list(g) for g in self.whole.group_names]
        of = self.param_names()
        return [[of[id(p)] for p in g["params"]] for g in self.optimizer.whole_param_groups]

    def numbering(self):
        """The parameter names in the order the whole optimizer state dict numbers them: the one-process
        optimizer's (across the groups), or where this rank's optimizer sees the whole model under ZeRO, its flat
        order (as its own state_dict numbers them)."""
        if self.zero and self.whole is None:
            of = self.param_names()
            return [of[id(p)] for p in self.optimizer.params]
        return None

    def param_groups(self):
        """state.json's record of the whole model's param groups (options and parameter names)."""
        return param_groups.record(self.optimizer.param_groups, self.group_names())

    # ------------------------------------------------------------------------------------------- entries
    def model_pieces(self, t):
        """The pieces of a state-dict entry this rank holds (a fully_shard parameter: its flat piece)."""
        return param_pieces(t, self.tp_rank, self.tp_size)

    def state_holders(self):
        """(tensor the optimizer keeps state for, its parameter, first flat element, element count): a ZeRO piece (a
        flat range of the parameter's shard) or, without ZeRO, the parameter itself (count None)."""
        if self.zero:
            return [(view, p, a, b - a) for view, _, p, _, a, b in self.optimizer.pieces]
        stepped = self.stepped()
        out = []
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                param = stepped.get(id(p))
                if param is None:
                    out.append((p, p, 0, None))
                else:  # a fully_shard parameter's view: its flat piece (none on some ranks)
                    piece = param.placement.flat_shard.local_piece(param)
                    out.append((p, param, piece[0] if piece is not None else 0, p.numel()))
        return out

    def state_pieces(self, array, p, start, length):
        """The pieces of the whole state tensor of ``p`` that ``array`` (a holder's state) covers."""
        spec = p.placement.tensor_shard
        if length is None:
            return tensor_pieces(array, spec, self.tp_rank, self.tp_size)
        return flat_pieces(tuple(p.shape), array, start, spec, self.tp_rank, self.tp_size)

    def entries(self):
        """{entry name: LocalPieces} of what this rank holds now."""
        out = {f"{MODEL}{name}": self.model_pieces(t) for name, t in self.model_tensors().items()}
        names = self.param_names()
        for holder, p, start, length in self.state_holders():
            for key, value in (self.inner.state.get(holder) or {}).items():
                entry = optimizer_entry(names[id(p)], key)
                if backend.is_array_like(value) and value.ndim:
                    out[entry] = self.state_pieces(value, p, start, length)
                elif not key.startswith("_"):
                    out[entry] = dcp.LocalPieces.whole(np.array(value))
        return out

    # ---------------------------------------------------------------------------------------------- load
    def model_targets(self):
        """{entry: LocalPieces} of the model's tensors, to be filled in place."""
        return {f"{MODEL}{name}": self.model_pieces(t) for name, t in self.model_tensors().items()}

    def optimizer_targets(self, saved):
        """For each tensor this rank's optimizer keeps state for (a parameter it updates, or its ZeRO piece) that
        ``saved`` ({entry: info with shape and dtype}) holds state of: ({entry: LocalPieces} to fill, that tensor,
        {state key: the array they fill}), one tensor at a time, so that its state can be handed to the optimizer (and
        its state store) before the next one is read."""
        names = self.param_names()
        saved_keys = {}  # parameter name -> [(state key, entry, entry info)]
        for entry, name, key, info in optimizer_entries(saved):
            saved_keys.setdefault(name, []).append((key, entry, info))
        for holder, p, start, length in self.state_holders():
            batch, arrays = {}, {}
            for key, entry, info in saved_keys.get(names[id(p)], ()):
                if info["shape"]:
                    array = np.zeros(length if length is not None else tuple(p.shape), entry_dtype(info["dtype"]))
                    batch[entry] = self.state_pieces(array, p, start, length)
                else:
                    array = np.zeros((), entry_dtype(info["dtype"]))
                    batch[entry] = dcp.LocalPieces.whole(array)
                arrays[key] = array
            if batch:
                yield batch, holder, arrays

    def keep_state(self, holder, arrays):
        """{state key: value} the optimizer keeps of ``holder``'s filled ``arrays`` (its state store takes them now:
        an offloaded state is written out before the next tensor's is read)."""
        return {key: self.inner.keep_state(holder, key, array) for key, array in arrays.items()}

    def load_optimizer(self, kept, group_options):
        """Load the state ``keep_state`` kept ({id of the tensor holding it: {key: value}}) into the optimizer, with
        the saved param groups' options (``group_options``: one dict per group)."""
        index = numbering(self.inner.param_groups)
        groups = packed_groups(self.inner.param_groups, index, options=group_options)
        state = {index[holder_id]: values for holder_id, values in kept.items()}
        self.inner.load_state_dict({"state": state, "param_groups": groups})


__all__ = ["RunEntries", "WholeNames", "optimizer_entries", "optimizer_entry", "entry_dtype", "MODEL", "OPTIMIZER"]
