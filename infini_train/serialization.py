"""``infini_train.save(obj, f)`` / ``infini_train.load(f, map_location=None)``: torch.save's role, never pickle.

The file is a plain safetensors file. Every distinct array is one safetensors tensor under a generated key
("0", "1", ...); ``__metadata__`` holds ``format`` ("infini_train"), ``version`` and ``structure``, a JSON tree
describing the object, in which these nodes stand for what JSON cannot say itself:

    {"float": "inf" | "-inf" | "nan"}                 a non-finite float
    {"list": [...]}  {"tuple": [...]}                 sequences
    {"dict": [[key, value], ...], "ordered": bool}    dicts: str or int keys, in order (OrderedDict if ordered)
    {"tensor": n, "storage": key, "dtype": "bfloat16", "shape": [...], "requires_grad": bool,
     "device": "cuda:0", "parameter": bool}           the n-th distinct Tensor object
    {"tensor": n}                                     the same Tensor object again
    {"tensor": n, ..., "offset": k, "strides": [...]} a view: elements of a 1-D storage shared with other views
    {"ndarray": key}                                  a NumPy array (loaded back as one)

None, bools, ints, finite floats and strings are themselves. Tensors that share one array are stored once and
come back sharing one array, and views of one array (a tensor and its slices) come back as views of one array, as
torch.load gives them (version 2; version 1 files still load); the same Tensor object comes back as one object.
Other shared containers come back as copies.
"""
from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

import numpy as np

from . import backend
from .atomic_file import write_atomically
from safetensors.numpy import save as _to_bytes, save_file as _save_file

from .distributed.sharded_tensor import ShardedTensor
from .nn.module import Module, Parameter
from .tensor import Tensor

FORMAT = "infini_train"
VERSION = "2"
_READS = ("1", "2")  # version 2 added views sharing a storage ("offset", "strides") and NumPy arrays
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the header size

# numpy dtype name -> safetensors dtype code
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
          "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32", "uint16": "U16",
          "uint8": "U8", "bool": "BOOL"}
_SUPPORTED = "dicts (str or int keys), lists, tuples, None, bool, int, float, str, Tensors and NumPy arrays"
_REWRITE = "HINT: the file was cut short, altered or not written by it.save; write it again"
_TORCH_FILE = ("is a zip/pickle file (torch.save's format), not one written by infini_train.save; infini_train "
               "never unpickles\nHINT: in torch, save tensors with safetensors.torch.save_file(state_dict, path) "
               "and read that with safetensors.numpy.load_file")


def _dtype(name):
    return backend.bfloat16 if name == "bfloat16" else np.dtype(name)


# ------------------------------------------------------------------------------------------------ save
class _Flattener:
    """Walks an object into (arrays by key, JSON structure); ``where`` names the current position for errors."""

    def __init__(self):
        self.arrays = {}
        self.storage_keys = {}  # id(array) -> key
        self.tensor_ids = {}  # id(Tensor) -> n
        self.open_containers = set()
        self.pending = []  # (node, array) of tensors, their storages assigned by finish()
        self.ndarrays = {}  # id(ndarray) -> (node, array): the same array object again is the same node

    def ndarray(self, a, where):
        """A NumPy array, loaded back as a NumPy array (as torch's pickle-based save keeps them)."""
        if id(a) in self.ndarrays:
            return self.ndarrays[id(a)][0]
        if a.dtype.name not in _CODES:
            raise TypeError(f"save: {where} is a NumPy array of dtype {a.dtype}, which the file format cannot hold "
                            f"(expected one of {sorted(_CODES)})\nHINT: convert it first, e.g. a.astype(np.float32)")
        key = str(len(self.arrays))
        self.arrays[key] = np.ascontiguousarray(a)
        node = {"ndarray": key}
        self.ndarrays[id(a)] = (node, a)
        return node

    def node(self, obj, where):
        if obj is None or isinstance(obj, bool):
            return obj
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"float": repr(float(obj))}
        if isinstance(obj, Tensor):
            return self.tensor(obj, where)
        if type(obj) is np.ndarray:
            return self.ndarray(obj, where)
        if type(obj) in (dict, OrderedDict, list, tuple):
            if id(obj) in self.open_containers:
                raise ValueError(f"save: {where} contains itself\nHINT: save an object without reference cycles")
            self.open_containers.add(id(obj))
            try:
                return self.container(obj, where)
            finally:
                self.open_containers.discard(id(obj))
        raise TypeError(f"save: cannot save {where} of type {type(obj).__qualname__}; infini_train.save holds "
                        f"{_SUPPORTED}\nHINT: {_hint_for(obj)}")

    def container(self, obj, where):
        if isinstance(obj, dict):
            pairs = []
            for k, v in obj.items():
                if not isinstance(k, (str, int)):
                    raise TypeError(f"save: {where} has a key {k!r} of type {type(k).__qualname__}; dict keys must be "
                                    "str or int\nHINT: turn the keys into strings, e.g. {str(k): v for k, v in "
                                    "d.items()}")
                key = str(k) if isinstance(k, str) else k if isinstance(k, bool) else int(k)
                pairs.append([key, self.node(v, f"{where}[{k!r}]")])
            return {"dict": pairs, "ordered": type(obj) is OrderedDict}
        items = [self.node(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return {"tuple" if type(obj) is tuple else "list": items}

    def tensor(self, t, where):
        n = self.tensor_ids.get(id(t))
        if n is not None:
            return {"tensor": n}
        array = t.array
        if array.dtype.name not in _CODES:
            raise TypeError(f"save: {where} is a Tensor of dtype {array.dtype}, which the file format cannot hold "
                            f"(expected one of {sorted(_CODES)})\nHINT: convert it first, e.g. t.to(it.float32)")
        n = self.tensor_ids[id(t)] = len(self.tensor_ids)
        node = {"tensor": n, "storage": None, "dtype": array.dtype.name, "shape": list(array.shape),
                "requires_grad": bool(t.requires_grad), "device": str(t.device), "parameter": isinstance(t, Parameter)}
        self.pending.append((node, array))
        return node

    def finish(self):
        """Assign the tensors their storages: arrays that are views of one NumPy base (a tensor and its slices) share
        one storage, the span of the base they cover, and record where they lie in it (``offset`` and ``strides`` in
        elements), so they load back as views of one array; any other array is stored once, as itself."""
        groups = {}
        for node, array in self.pending:
            groups.setdefault(id(_root(array)), []).append((node, array))
        for members in groups.values():
            root = _root(members[0][1])
            if len({id(a) for _, a in members}) > 1 and _shareable(root, [a for _, a in members]):
                self._store_views(root, members)
                continue
            for node, array in members:
                key = self.storage_keys.get(id(array))
                if key is None:
                    key = str(len(self.arrays))
                    host = backend.to_device_array(array, backend.CPU)
                    self.arrays[key] = host if host.flags.c_contiguous else host.copy(order="C")  # 0-d stays 0-d
                    self.storage_keys[id(array)] = key
                node["storage"] = key

    def _store_views(self, root, members):
        size = root.dtype.itemsize
        spans = [_span(a, root) for _, a in members]
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
        key = str(len(self.arrays))
        self.arrays[key] = np.ascontiguousarray(root.reshape(-1)[lo:hi])
        for node, array in members:
            first = (_address(array) - _address(root)) // size
            node.update(storage=key, offset=first - lo, strides=[s // size for s in array.strides])


def _address(a):
    return a.__array_interface__["data"][0]


def _root(array):
    """The NumPy array that owns ``array``'s memory (``array`` itself when it is not a view, or not on the host)."""
    if type(array) is not np.ndarray:
        return array
    root = array
    while type(root.base) is np.ndarray:
        root = root.base
    return root


def _shareable(root, arrays):
    """Whether the views of ``root`` can be stored as one span of it: a C-contiguous host array, every view non-empty,
    of its dtype and at whole-element offsets and strides."""
    size = root.dtype.itemsize
    return (type(root) is np.ndarray and root.flags.c_contiguous and all(
        a.size and a.dtype == root.dtype and (_address(a) - _address(root)) % size == 0
        and all(s % size == 0 for s in a.strides) for a in arrays))


def _span(a, root):
    """[first, last + 1) elements of ``root``'s flat memory that the view ``a`` touches."""
    size = root.dtype.itemsize
    first = (_address(a) - _address(root)) // size
    low = sum(min(0, (n - 1) * s // size) for n, s in zip(a.shape, a.strides))
    high = sum(max(0, (n - 1) * s // size) for n, s in zip(a.shape, a.strides))
    return first + low, first + high + 1


def _hint_for(obj):
    if isinstance(obj, ShardedTensor):
        return ("it is one rank's shard of a sharded tensor (a fully_shard model's state): write the shards with "
                "it.distributed.checkpoint.save(state, directory) on every rank, or gather whole tensors with "
                "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) from "
                "it.distributed.checkpoint and it.save that on rank 0")
    if hasattr(obj, "state_dict"):
        owner = "model" if isinstance(obj, Module) else "optimizer" if hasattr(obj, "param_groups") else "scheduler"
        return (f"save its state instead: it.save({{'{owner}': {owner}.state_dict()}}, f), then restore it with "
                f"{owner}.load_state_dict(it.load(f)['{owner}'])")
    if isinstance(obj, np.generic):
        return "save the Python number: value.item()"
    return "convert it to those types first (a dict of its fields, or its state_dict())"


def save(obj, f):
    """Write ``obj`` (any nesting of dicts, lists, tuples, None, bool, int, float, str and Tensors) to ``f``, a
    path or a binary file object, as one safetensors file. A path is written atomically: into a temporary file
    in the same directory, flushed and fsynced, then renamed over the destination."""
    is_path = isinstance(f, (str, os.PathLike))
    if not is_path and not hasattr(f, "write"):
        raise TypeError(f"save: f must be a path (str or os.PathLike) or a binary file object, got "
                        f"{type(f).__name__}\nHINT: it.save(obj, 'checkpoint.safetensors')")
    flat = _Flattener()
    structure = flat.node(obj, "obj")
    flat.finish()
    metadata = {"format": FORMAT, "version": VERSION,
                "structure": json.dumps(structure, allow_nan=False, ensure_ascii=False, separators=(",", ":"))}
    if is_path:  # safetensors writes the temporary file itself (no second copy of the data in memory)
        write_atomically(os.fspath(f), lambda tmp: _save_file(flat.arrays, tmp, metadata=metadata))
    else:
        f.write(_to_bytes(flat.arrays, metadata=metadata))


# ------------------------------------------------------------------------------------------------ load
class _FileFormatError(ValueError):
    pass


def load(f, map_location=None):
    """Read an object written by ``save`` from a path or a binary file object.

    ``map_location=None`` puts every tensor back on the device it was saved from; a device (``"cpu"``,
    ``"cuda:1"``, an ``it.Device``) puts them all there."""
    target = None
    if map_location is not None:
        if not isinstance(map_location, (str, backend.Device)):
            raise TypeError(f"load: map_location must be None, a device string or an it.Device, got "
                            f"{type(map_location).__name__}\nHINT: map_location='cpu'")
        target = backend.Device.parse(map_location)
    if isinstance(f, (str, os.PathLike)):
        name = os.fspath(f)
        with open(name, "rb") as fh:
            return _read(fh, name, target)
    if hasattr(f, "read"):
        return _read(f, getattr(f, "name", f"<{type(f).__name__}>"), target)
    raise TypeError(f"load: f must be a path (str or os.PathLike) or a binary file object, got {type(f).__name__}")


def _read(fh, name, target):
    try:
        header, length = _read_header(fh)
        structure, entries = _parse_header(header)
        storages = _read_arrays(fh, entries, 8 + length)
    except _FileFormatError as exc:
        raise ValueError(f"load: {name} {exc}") from None
    try:
        return _Builder(storages, target, name).node(structure)
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"load: {name} has a corrupted structure description ({type(exc).__name__}: {exc})\n"
                         f"{_REWRITE}") from None


def _read_header(fh):
    head = fh.read(8)
    if len(head) < 8:
        raise _FileFormatError(f"is not a safetensors file written by infini_train.save: only {len(head)} bytes\n"
                               "HINT: the file is empty or was cut short; write it again")
    length = int.from_bytes(head, "little")
    # a zip (torch.save) or pickle (legacy torch.save) start reads as a huge or unparsable header
    torch_like = head[:4] == b"PK\x03\x04" or (head[0] == 0x80 and 2 <= head[1] <= 5)
    if length > _MAX_HEADER:
        raise _FileFormatError(_TORCH_FILE if torch_like else f"is not a safetensors file: its first 8 bytes give a "
                               f"header of {length} bytes\nHINT: it.load reads files written by it.save")
    raw = fh.read(length)
    if len(raw) < length:
        raise _FileFormatError(_TORCH_FILE if torch_like else f"is truncated: its header needs {length} bytes, the "
                               f"file holds {len(raw)}\nHINT: the write was interrupted or the copy is incomplete; "
                               "write it again")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _FileFormatError(_TORCH_FILE if torch_like else "is not a safetensors file: its header is not JSON\n"
                               "HINT: it.load reads files written by it.save") from None
    if not isinstance(header, dict):
        raise _FileFormatError("is not a safetensors file: its header is not a JSON object\n"
                               "HINT: it.load reads files written by it.save")
    return header, length


def _parse_header(header):
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "structure" not in meta:
        raise _FileFormatError("is a safetensors file without infini_train.save's metadata (no "
                               f"__metadata__['format'] == {FORMAT!r}), so it describes no object\nHINT: read plain "
                               "safetensors with safetensors.numpy.load_file, or GPT2.from_pretrained for weights")
    if meta.get("version") not in _READS:
        raise _FileFormatError(f"was written in version {meta.get('version')!r} of the format; this reader knows "
                               f"version {VERSION!r}\nHINT: load it with the infini_train release that wrote it")
    try:
        structure = json.loads(meta["structure"])
    except (TypeError, json.JSONDecodeError):
        raise _FileFormatError(f"has a corrupted structure description in its metadata\n{_REWRITE}") from None
    codes = {code: name for name, code in _CODES.items()}
    entries = {}
    for key, spec in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = _dtype(codes[spec["dtype"]])
            shape = tuple(int(d) for d in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise _FileFormatError(f"has a malformed header entry for tensor {key!r}: {spec!r}\n{_REWRITE}") from None
        if min(shape, default=0) < 0 or end - begin != math.prod(shape) * dtype.itemsize or begin < 0:
            raise _FileFormatError(f"has inconsistent sizes for tensor {key!r}: shape {list(shape)} of {dtype} "
                                   f"in bytes [{begin}, {end})\n{_REWRITE}")
        entries[key] = (dtype, shape, begin)
    return structure, entries


def _read_arrays(fh, entries, data_start):
    """Each tensor read straight into its own (aligned, writable) array."""
    arrays = {}
    position = data_start
    seekable = getattr(fh, "seekable", lambda: False)()
    for key, (dtype, shape, begin) in sorted(entries.items(), key=lambda item: item[1][2]):
        array = np.empty(shape, dtype)
        if array.nbytes:
            if seekable:
                fh.seek(data_start + begin)
            elif data_start + begin > position:
                fh.read(data_start + begin - position)
            _read_exactly(fh, array.reshape(-1).view(np.uint8))
            position = data_start + begin + array.nbytes
        arrays[key] = array
    return arrays


def _read_exactly(fh, out):
    view, done = memoryview(out), 0
    while done < len(view):
        if hasattr(fh, "readinto"):
            n = fh.readinto(view[done:])
        else:
            chunk = fh.read(len(view) - done)
            n = len(chunk)
            view[done:done + n] = chunk
        if not n:
            raise _FileFormatError(f"is truncated: a tensor needs {len(view)} bytes, the file ends after {done}\n"
                                   f"{_REWRITE}")
        done += n


class _Builder:
    """Rebuilds the object from its structure; tensors go to their saved device or to ``target``."""

    def __init__(self, storages, target, name):
        self.storages, self.target, self.name = storages, target, name
        self.tensors = {}
        self.on_device = {}  # (storage key, device) -> array, so shared arrays stay shared
        self.ndarrays = {}  # storage key -> the NumPy array loaded from it

    def view(self, storage, node):
        """The view a node describes (``offset`` and ``strides`` in elements) into its 1-D ``storage``."""
        offset, strides, shape = int(node["offset"]), [int(s) for s in node["strides"]], node["shape"]
        low = offset + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
        high = offset + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides))
        if storage.ndim != 1 or low < 0 or high >= storage.size:
            raise ValueError(f"load: {self.name} has a corrupted structure description: a view reaches outside its "
                             f"storage\n{_REWRITE}")
        xp = np if isinstance(storage, np.ndarray) else __import__("cupy")
        size = storage.dtype.itemsize
        return xp.lib.stride_tricks.as_strided(storage[offset:], shape, [s * size for s in strides])

    def node(self, node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, dict):
            if "float" in node:
                return float(node["float"])
            if "list" in node:
                return [self.node(v) for v in node["list"]]
            if "tuple" in node:
                return tuple(self.node(v) for v in node["tuple"])
            if "dict" in node:
                out = OrderedDict() if node.get("ordered") else {}
                for k, v in node["dict"]:
                    out[k] = self.node(v)
                return out
            if "tensor" in node:
                return self.tensor(node)
            if "ndarray" in node:
                return self.ndarray(node)
        raise ValueError(f"load: {self.name} has a corrupted structure description: unexpected node {node!r}\n"
                         f"{_REWRITE}")

    def ndarray(self, node):
        key = node["ndarray"]
        if key not in self.ndarrays:
            self.ndarrays[key] = self.storages[key]
        return self.ndarrays[key]

    def tensor(self, node):
        n = node["tensor"]
        if "storage" not in node:
            return self.tensors[n]
        key = node["storage"]
        host = self.storages.get(key)
        if host is not None and "offset" in node:
            host = self.view(host, node)
        if host is None or host.dtype.name != node["dtype"] or list(host.shape) != node["shape"]:
            raise ValueError(f"load: {self.name} has a corrupted structure description: tensor {n} does not match "
                             f"stored array {key!r}\n{_REWRITE}")
        device = self.target or backend.Device.parse(node["device"])
        if device.type == "cuda" and (device, key) not in self.on_device:
            _check_cuda(device, self.name)
        array = self.on_device.get((key, device))
        if array is None:
            with device.context():
                array = self.on_device[(key, device)] = backend.to_device_array(self.storages[key], device)
        if "offset" in node:
            array = self.view(array, node)
        t = Tensor._make(array, device, requires_grad=bool(node["requires_grad"]))
        if node.get("parameter"):
            t = Parameter(t, requires_grad=bool(node["requires_grad"]))
        self.tensors[n] = t
        return t


def _check_cuda(device, name):
    count = backend.device_count("cuda")
    if device.index >= count:
        raise RuntimeError(f"load: {name} holds tensors saved on {device}, but this machine has "
                           f"{count} CUDA device(s)\nHINT: pass map_location='cpu' (or another device) to load them "
                           "there")


__all__ = ["save", "load"]
