"""Reading a checkpoint, in either format, as one procedure: its state is a set of entries (entries.py), each filled
into the pieces a rank holds from whichever files hold it, reading only the boxes that rank keeps. A sharded
checkpoint's entries are its metadata's; a whole checkpoint is read as the sharded format's one-rank case: each
tensor of model.safetensors and optimizer.safetensors one chunk of its entry (the optimizer's named through the
whole model's param groups), the steps from state.json. In one process, ``load_checkpoint`` assembles either format
whole (the model's state dict, the optimizer's in torch's layout).
"""
from __future__ import annotations

import os

import numpy as np

from ..distributed import checkpoint as dcp
from ..distributed.checkpoint.whole_files import SavedTensor
from ..safetensors_io import SafetensorsError, dtype_code, mapped_safetensors, read_header
from . import param_groups
from .directory import CheckpointError, read_state, resolve_checkpoint
from .entries import MODEL, entry_dtype, optimizer_entries, optimizer_entry
from .tree import unflatten_state
from .verify import checkpoint_candidates, is_sharded, none_verified, verify_checkpoint
from .whole_files import MODEL_FILE, OPTIMIZER_FILE


class _FileKey(str):
    """An array of a whole checkpoint's optimizer state: its name in optimizer.safetensors."""


class _FileKeys(dict):
    def __missing__(self, key):
        return _FileKey(key)


class SavedEntries:
    """The entries of the checkpoint in ``path`` (``state``: its state.json): ``tensors`` {entry: shape, dtype and
    chunks}, ``group_options`` the options of its optimizer's param groups; ``load(targets)`` fills {entry:
    LocalPieces}. ``group_names``: the whole model's param groups by name, which name a whole checkpoint's optimizer
    state."""

    def __init__(self, path, state, group_names=None):
        self.path, self.values = path, {}
        try:
            if is_sharded(state):
                self.metadata = dcp.read_metadata(path)
                saved = state["optimizer"]["param_groups"]
                self.group_options = [param_groups.options(g) for g in saved]
            else:
                self.metadata = {"tensors": self._whole_tensors(state, group_names)}
        except (dcp.CheckpointFormatError, SafetensorsError, OSError) as exc:
            raise CheckpointError(f"checkpoint {path} is unreadable: {exc}\nHINT: it may be incomplete or corrupted; "
                                  "resume from an earlier one") from exc
        self.tensors = self.metadata["tensors"]

    def _whole_tensors(self, state, group_names):
        header = read_header(os.path.join(self.path, MODEL_FILE))[0]
        tensors = {f"{MODEL}{name}": _one_chunk(MODEL_FILE, name, info) for name, info in header.items()}
        optimizer = unflatten_state(state["optimizer"], _FileKeys())
        self.group_options = [{k: v for k, v in g.items() if k != "params"} for g in optimizer["param_groups"]]
        names = param_groups.names_by_number(optimizer["param_groups"], group_names)
        if names is None:
            raise CheckpointError(f"checkpoint {self.path}: its optimizer's param groups hold "
                                  f"{[len(g['params']) for g in optimizer['param_groups']]} parameters, this model's "
                                  f"{[len(g) for g in group_names]}\nHINT: the checkpoint was written for another "
                                  "model; resume with its own config")
        header = read_header(os.path.join(self.path, OPTIMIZER_FILE))[0]
        for number, entry_state in optimizer["state"].items():
            for key, value in entry_state.items():
                entry = optimizer_entry(names[int(number)], key)
                if isinstance(value, _FileKey):
                    tensors[entry] = _one_chunk(OPTIMIZER_FILE, value, header[value])
                else:
                    array = np.array(value)
                    tensors[entry] = {"shape": [], "dtype": dtype_code(array.dtype), "chunks": []}
                    self.values[entry] = array
        return tensors

    def load(self, targets):
        """Fill ``targets`` ({entry: LocalPieces}) from the checkpoint."""
        rest = {}
        for entry, pieces in targets.items():
            if entry in self.values:
                for _, view in pieces.pieces:
                    view[...] = self.values[entry]
            else:
                rest[entry] = pieces
        try:
            dcp.load(rest, self.path, metadata=self.metadata)
        except dcp.CheckpointFormatError as exc:  # (it names the checkpoint, what does not fit and a hint)
            raise CheckpointError(str(exc)) from exc
        except (SafetensorsError, OSError) as exc:
            raise CheckpointError(f"checkpoint {self.path} is unreadable: {exc}\nHINT: it may be incomplete or "
                                  "corrupted; resume from an earlier one") from exc


def _one_chunk(file, key, info):
    return {"shape": list(info["shape"]), "dtype": info["dtype"],
            "chunks": [{"offsets": [0] * len(info["shape"]), "sizes": list(info["shape"]), "file": file, "key": key}]}


# ------------------------------------------------------------------------------------------- whole, in one process
def load_checkpoint(path, verify=True):
    """(model state {name: array}, optimizer state in torch's layout, state.json's dict without the optimizer) of a
    checkpoint of either format, assembled whole in this process, after verifying every file against the hashes
    recorded at save time (``verify=False``: already verified by the caller)."""
    path = resolve_checkpoint(path)
    state = verify_checkpoint(path) if verify else read_state(path)
    model_state, optimizer_state = whole_state(path, state)
    state.pop("optimizer")
    return model_state, optimizer_state, state


def whole_state(path, state, model_only=False):
    """(model state {name: array}, optimizer state in torch's layout or None with ``model_only``) of the checkpoint
    in ``path`` (``state``: its state.json): a whole checkpoint's files, or a sharded one's entries assembled (the
    optimizer numbered as the one-process optimizer numbers its parameters)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        if not is_sharded(state):
            model_state = load_file(os.path.join(path, MODEL_FILE))
            if model_only:
                return model_state, None
            return model_state, unflatten_state(state["optimizer"], load_file(os.path.join(path, OPTIMIZER_FILE)))
        metadata = dcp.read_metadata(path)
        tensors = metadata["tensors"]
        wanted = {e: info for e, info in tensors.items() if not (model_only and not e.startswith(MODEL))}
        arrays = {e: np.zeros(tuple(info["shape"]), entry_dtype(info["dtype"])) for e, info in wanted.items()}
        dcp.load(arrays, path, metadata=metadata)
    except (OSError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}\nHINT: it may be incomplete or corrupted; "
                              "resume from an earlier one") from exc
    model_state = {e[len(MODEL):]: a for e, a in sorted(arrays.items()) if e.startswith(MODEL)}  # by name, as a
    # whole checkpoint's model file gives them
    if model_only:
        return model_state, None
    index, groups = param_groups.numbered(state["optimizer"]["param_groups"])
    per_param = {}
    for entry, name, key, _ in optimizer_entries(tensors):
        array = arrays[entry]
        per_param.setdefault(index[name], {})[key] = int(array) if array.ndim == 0 else array
    return model_state, {"state": per_param, "param_groups": groups}


def load_model_checkpoint(path, warn=None):
    """(model_state, state) for inference: only state.json and the model's files are verified and read, so a
    damaged optimizer file does not matter. ``path``: a step directory (which must verify), its state.json, or a
    run's out_dir, whose newest checkpoint with a good model is used, ``warn(message)`` naming each one skipped.
    Raises CheckpointError naming every checkpoint tried and why."""
    named, candidates = checkpoint_candidates(path)
    failures = []
    for candidate in candidates:
        try:
            state = verify_checkpoint(candidate, model_only=True)
            model_state = _model_state(candidate, state)
        except CheckpointError as exc:
            failures.append(str(exc))
        else:
            for skipped in failures:
                (warn or print)(f"skipping {skipped}")
            state.pop("optimizer", None)
            return model_state, state
    raise none_verified(candidates[0] if named else os.fspath(path), named, failures, model_only=True)


def _model_state(path, state):
    if is_sharded(state):
        return whole_state(path, state, model_only=True)[0]
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(os.path.join(path, MODEL_FILE))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc


def mapped_model_checkpoint(path):
    """{name: array-like} of a checkpoint's model after verifying its model files, each tensor read box by box
    when indexed (MappedArray / SavedTensor), so a rank reads only the parts it keeps; and its state.json."""
    path = resolve_checkpoint(path)
    state = verify_checkpoint(path, model_only=True)
    try:
        if is_sharded(state):
            metadata = dcp.read_metadata(path)
            return {e[len(MODEL):]: SavedTensor(path, e, metadata) for e in metadata["tensors"]
                    if e.startswith(MODEL)}, state
        return mapped_safetensors(os.path.join(path, MODEL_FILE)), state
    except (dcp.CheckpointFormatError, SafetensorsError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc


__all__ = ["SavedEntries", "load_checkpoint", "whole_state", "load_model_checkpoint", "mapped_model_checkpoint"]
