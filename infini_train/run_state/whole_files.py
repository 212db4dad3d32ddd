"""The whole format: a checkpoint as one process holds it, ``model.safetensors`` (the model's state dict),
``optimizer.safetensors`` (the arrays of the optimizer's state dict in torch's layout, ``state.<number>.<key>``) and
the rest of that state dict (steps, param groups) in state.json. It is the consolidation of a run's entries
(entries.py): ``model/<name>`` is the model file's ``<name>``, ``optimizer/<parameter>/<key>`` the optimizer file's
``state.<number>.<key>``, numbered as the whole model's optimizer numbers its parameters.

Tensor files are written one tensor at a time, in safetensors' own order (dtype, then name), so their bytes are those
``safetensors.numpy.save_file`` writes for the same tensors.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..atomic_file import write_atomically
from ..safetensors_io import dtype_code, numpy_dtype
from . import param_groups
from .entries import MODEL, optimizer_entries
from .tree import flatten_state, to_numpy

MODEL_FILE, OPTIMIZER_FILE = "model.safetensors", "optimizer.safetensors"
TENSOR_FILES = (MODEL_FILE, OPTIMIZER_FILE)
# safetensors' dtype order (its Dtype enum), ascending; a file lists its tensors by dtype, largest first, then name
_DTYPE_ORDER = ("BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64")


def write_tensor_file(path, infos, read):
    """Write the tensors ``infos`` ({name: (shape, dtype code)}) to the safetensors file ``path`` (atomically), each
    read with ``read(name)`` (an array) only when its turn comes: at most one tensor in memory at a time."""
    order = sorted(infos, key=lambda name: (-_DTYPE_ORDER.index(infos[name][1]), name))
    header, offset = {}, 0
    for name in order:
        shape, code = infos[name]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(numpy_dtype(code, path, name)).itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in order:
                array = np.require(to_numpy(read(name)), numpy_dtype(infos[name][1], path, name), "C")
                f.write(array.reshape(-1).view(np.uint8).data)

    write_atomically(path, write)
    return path


def infos_of(arrays):
    """{name: (shape, dtype code)} of {name: array}."""
    return {name: (tuple(a.shape), dtype_code(a.dtype)) for name, a in arrays.items()}


def layout(model_keys, saved_groups, tensors, scalar, order=None):
    """How entries make the whole format's files: ({file: {name in the file: entry}}, the optimizer state's skeleton
    for state.json). ``model_keys``: the model's names in order; ``saved_groups``: the param groups' record
    (param_groups.record); ``tensors``: {entry: info with its shape} (the optimizer's are read from it);
    ``scalar(entry)``: a 0-d entry's value; ``order``: the optimizer's numbering (entries.numbering)."""
    index, groups = param_groups.numbered(saved_groups, order)
    per_param, names = {}, {}
    for entry, name, key, info in optimizer_entries(tensors):
        i = index[name]
        if info["shape"]:
            per_param.setdefault(i, {})[key] = np.empty(0)  # a placeholder: the file holds the data
            names[f"state.{i}.{key}"] = entry
        else:
            per_param.setdefault(i, {})[key] = scalar(entry)
    _, skeleton = flatten_state({"state": {i: per_param[i] for i in sorted(per_param)}, "param_groups": groups})
    files = {MODEL_FILE: {name: f"{MODEL}{name}" for name in model_keys}, OPTIMIZER_FILE: names}
    return files, skeleton


def write_files(directory, files, infos, read):
    """Write the whole format's tensor files into ``directory``: ``files`` as ``layout`` gives it, ``infos``
    {entry: (shape, dtype code)}, ``read(entry)`` an entry's whole array."""
    for file, names in files.items():
        write_tensor_file(os.path.join(directory, file), {n: infos[e] for n, e in names.items()},
                          lambda n, names=names: read(names[n]))


__all__ = ["write_tensor_file", "infos_of", "layout", "write_files", "MODEL_FILE", "OPTIMIZER_FILE", "TENSOR_FILES"]
