"""Sharded checkpoints, as torch.distributed.checkpoint writes them: every rank writes the pieces it holds to its own
safetensors file, in parallel and without gathering anything; rank 0 writes ``metadata.json``, which maps every
global tensor (name, global shape, dtype) to its saved chunks (file, entry, offsets and sizes) and records each
file's size and SHA-256. A piece held by several ranks (a replicated tensor, the data-parallel copies of a shard) is
written once, by one of the ranks holding it (the one with the least to write).

Loading reshards: each rank asks for the boxes it holds now (LocalPieces, in any layout) and reads, through a memory
map, only the parts of the saved chunks that overlap them.

    save({"w": LocalPieces(...), "b": array}, directory, group)  # collective
    load({"w": LocalPieces(...), "b": array}, directory)           # fills the arrays in place
    save({"model": model.state_dict(), "optim": optimizer_state}, checkpoint_id=directory)  # nested, as torch's

A fully_shard model's state dict holds ShardedTensors (each rank's shard and its placement): written as the boxes
they cover. Nested dicts are walked (nested.py): their other values (steps, options) go into the metadata as JSON.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os

import numpy as np

from ... import backend
from ...atomic_file import write_text_atomically
from ...safetensors_io import Deferred, SafetensorsError, _code, _numpy_dtype, mapped_safetensors, write_safetensors
from ...tensor import array_of
from ..sharded_tensor import ShardedTensor
from . import nested
from .pieces import LocalPieces, overlap, region

METADATA = "metadata.json"
FORMAT = "infini_train.sharded/1"


class CheckpointFormatError(ValueError):
    """A sharded checkpoint that is missing, incomplete or does not fit what is loaded into it."""


def shard_file(rank):
    return f"shard{rank:05d}.safetensors"


def _as_pieces(name, value):
    if isinstance(value, LocalPieces):
        return value
    if isinstance(value, ShardedTensor):
        return value.local_pieces()
    array = array_of(value)  # a Tensor or an array held whole
    if not backend.is_array_like(array):
        raise TypeError(f"sharded checkpoint: {name!r} is a {type(value).__name__}; expected LocalPieces, a Tensor or "
                        "an array")
    return LocalPieces.whole(array)


def _entry_key(name, offsets):
    return f"{name}@{','.join(str(o) for o in offsets)}"


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _directory(directory, checkpoint_id, what):
    if (directory is None) == (checkpoint_id is None):
        raise TypeError(f"{what}: expected the checkpoint's directory, as directory or checkpoint_id (torch's name), "
                        f"got directory={directory!r}, checkpoint_id={checkpoint_id!r}\nHINT: pass one of them")
    return os.fspath(directory if directory is not None else checkpoint_id)


def save(state, directory=None, group=None, extra=None, *, checkpoint_id=None, process_group=None):
    """Write ``state`` ({name: ShardedTensor | LocalPieces | Tensor | array}, or dicts and lists of them with other
    JSON values) as a sharded checkpoint in ``directory`` (``checkpoint_id``; collective over ``group``, alias
    ``process_group``, default the world). ``extra`` (JSON-serialisable, rank 0's) goes into the metadata. Returns
    the metadata dict on every rank."""
    from .. import all_gather_object, default_group

    directory = _directory(directory, checkpoint_id, "save")
    group = group or process_group or default_group()
    plan = plan_save(state, group)
    described = write_shard(directory, group.rank, plan.mine)
    files = [None] * group.size
    all_gather_object(files, described, group)
    metadata = plan.metadata(files, extra)
    if group.rank == 0:
        write_metadata(directory, metadata)
    group.barrier()
    return metadata


def write_metadata(directory, metadata):
    """Write ``metadata`` (SavePlan.metadata's) as the checkpoint's metadata.json, atomically."""
    write_text_atomically(os.path.join(directory, METADATA), json.dumps(metadata, indent=1))


class SavePlan:
    """What one rank writes of a sharded checkpoint, agreed by every rank (``plan_save``): ``mine``, {entry key:
    array} (views of the live state: copy them to write later), and the global table of every tensor's chunks."""

    def __init__(self, tensors, values, mine):
        self.tensors, self.values, self.mine = tensors, values, mine

    def metadata(self, files, extra=None):
        """metadata.json's content, from every rank's ``write_shard`` result (None: a rank that wrote nothing)."""
        metadata = {"format": FORMAT, "tensors": self.tensors,
                    "files": {f[0]: {"bytes": f[1], "sha256": f[2]} for f in files if f is not None},
                    "extra": extra}
        if self.values:
            metadata["objects"] = self.values
        return metadata


def plan_save(state, group):
    """Agree over ``group`` (collective) which rank writes each box of ``state`` (as ``save`` takes it); returns this
    rank's SavePlan."""
    from .. import all_gather_object

    tensors, objects = nested.walk(state)
    local = {name: _as_pieces(name, value) for name, value in tensors.items()}
    plan = {name: (pieces.global_shape, _code(np.dtype(pieces.dtype)), pieces.boxes())
            for name, pieces in local.items()}
    values = {path: nested.to_json(value, path) for path, _, _, value in objects}
    plans = [None] * group.size
    all_gather_object(plans, (plan, values), group)
    tensors, writer = _merge_plans([p for p, _ in plans])
    values = {}  # every rank's other values (a step only the ranks holding a shard have), rank 0's where they differ
    for _, held in reversed(plans):
        values.update(held)
    mine = {}
    for name, pieces in local.items():
        for offsets, view in pieces.pieces:
            if writer[(name, tuple(offsets), tuple(view.shape))] == group.rank:
                mine[_entry_key(name, offsets)] = view
    return SavePlan(tensors, values, mine)


def write_shard(directory, rank, mine):
    """Write ``mine`` ({entry key: array}) as rank ``rank``'s shard file in ``directory``; returns (file name, bytes,
    SHA-256), or None when there is nothing to write. Each array is read when the file gets to it: one piece at a
    time on the host (a device array's copy, an offloaded optimizer state's read)."""
    os.makedirs(directory, exist_ok=True)
    if not mine:
        return None
    path = os.path.join(directory, shard_file(rank))
    digest = hashlib.sha256()
    write_safetensors(path, {key: Deferred(view.shape, view.dtype, functools.partial(backend.to_device_array, view,
                                                                                     backend.CPU))
                             for key, view in mine.items()}, digest=digest)
    return shard_file(rank), os.path.getsize(path), digest.hexdigest()


def _merge_plans(plans):
    """{name: {shape, dtype, chunks}} and {(name, offsets, sizes): writing rank} from every rank's plan. A box held
    by several ranks is written by the one of them with the fewest bytes to write so far (every rank computes the
    same choice), so replicated tensors spread over the ranks' files instead of all landing in rank 0's."""
    tensors, holders = {}, {}
    for rank, plan in enumerate(plans):
        for name, (shape, dtype, boxes) in plan.items():
            info = tensors.setdefault(name, {"shape": list(shape), "dtype": dtype, "chunks": []})
            if tuple(info["shape"]) != tuple(shape) or info["dtype"] != dtype:
                raise ValueError(f"sharded checkpoint: ranks disagree on {name!r}: shape {tuple(info['shape'])} "
                                 f"{info['dtype']} on one, {tuple(shape)} {dtype} on rank {rank}")
            for offsets, sizes in boxes:
                holders.setdefault((name, tuple(offsets), tuple(sizes)), []).append(rank)
    load = [0] * len(plans)
    writer = {}
    for key in sorted(holders, key=lambda k: (len(holders[k]), k[0], k[1])):  # sole holders first
        name, offsets, sizes = key
        rank = min(holders[key], key=lambda r: (load[r], r))
        writer[key] = rank
        load[rank] += int(np.prod(sizes, dtype=np.int64)) * np.dtype(_numpy_dtype(tensors[name]["dtype"], "", name)
                                                                     ).itemsize
    for key in sorted(writer):
        name, offsets, sizes = key
        tensors[name]["chunks"].append({"offsets": list(offsets), "sizes": list(sizes),
                                        "file": shard_file(writer[key]), "key": _entry_key(name, offsets)})
    return tensors, writer


def read_metadata(directory):
    path = os.path.join(directory, METADATA)
    try:
        with open(path) as f:
            metadata = json.load(f)
    except FileNotFoundError:
        raise CheckpointFormatError(f"{directory}: no {METADATA}, so not a complete sharded checkpoint\nHINT: a save "
                                    "that was interrupted leaves no metadata; use an earlier checkpoint") from None
    except ValueError as exc:
        raise CheckpointFormatError(f"{path}: unreadable ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointFormatError(f"{path}: expected format {FORMAT!r}, got {metadata.get('format')!r}")
    return metadata


def verify(directory, files=None):
    """Check each shard file's size and SHA-256 against the metadata (only ``files`` when given); returns the
    problems found, one line each."""
    metadata = read_metadata(directory)
    problems = []
    for name, info in metadata["files"].items():
        if files is not None and name not in files:
            continue
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            problems.append(f"{name}: missing")
        elif os.path.getsize(path) != info["bytes"]:
            problems.append(f"{name}: {os.path.getsize(path)} bytes, the metadata says {info['bytes']} (truncated?)")
        elif file_digest(path) != info["sha256"]:
            problems.append(f"{name}: its SHA-256 differs from the metadata's (damaged)")
    return problems


class _Reader:
    """Saved entries as tensors read box by box (safetensors_io.mapped_safetensors): reading a box maps just its
    entry, so a rank's memory and address space grow by what it reads, not by the files."""

    def __init__(self, directory):
        self.directory, self.files = directory, {}

    def entry(self, file, key):
        path = os.path.join(self.directory, file)
        if file not in self.files:
            try:
                self.files[file] = mapped_safetensors(path)
            except SafetensorsError as exc:  # an entry running past the end of the file: truncated
                raise CheckpointFormatError(str(exc)) from None
        entries = self.files[file]
        if key not in entries:
            raise CheckpointFormatError(f"{path}: no entry {key!r}, which the metadata lists (damaged checkpoint)")
        return entries[key]


def load(state, directory=None, group=None, metadata=None, *, checkpoint_id=None, process_group=None):
    """Fill ``state`` (as ``save`` takes it: the boxes this rank holds now) from the sharded checkpoint in
    ``directory`` (``checkpoint_id``), reading only the overlapping parts of the saved chunks; its other values are
    replaced by the saved ones. Returns the metadata's ``extra``. Not a collective (``group`` is accepted for
    symmetry with ``save``). ``metadata``: the checkpoint's, when the caller already read it (loading tensor by
    tensor)."""
    directory = _directory(directory, checkpoint_id, "load")
    metadata = metadata or read_metadata(directory)
    reader = _Reader(directory)
    tensors, objects = nested.walk(state)
    saved = metadata.get("objects") or {}
    missing = [path for path, *_ in objects if path not in saved]
    if missing:
        raise CheckpointFormatError(f"{directory}: holds no value {missing[0]!r} ({len(missing)} missing)\nHINT: the "
                                    "checkpoint was written for another model or optimizer")
    for name, value in tensors.items():
        pieces = _as_pieces(name, value)
        info = metadata["tensors"].get(name)
        if info is None:
            raise CheckpointFormatError(f"{directory}: holds no tensor {name!r}\nHINT: the checkpoint was written for "
                                        "another model or optimizer")
        if tuple(info["shape"]) != pieces.global_shape:
            raise CheckpointFormatError(f"{directory}: {name!r} was saved with shape {tuple(info['shape'])}, this "
                                        f"model's is {pieces.global_shape}\nHINT: load it into the model it was "
                                        "written for")
        for offsets, view in pieces.pieces:
            _fill(view, tuple(offsets), info["chunks"], reader, name, directory)
    for path, container, key, value in objects:
        nested.restore(container, key, saved[path], value)
    return metadata.get("extra")


def _fill(view, offsets, chunks, reader, name, directory):
    needed = int(np.prod(view.shape, dtype=np.int64))
    covered = 0
    for chunk in chunks:
        met = overlap(offsets, view.shape, chunk["offsets"], chunk["sizes"])
        if met is None:
            continue
        part = np.asarray(reader.entry(chunk["file"], chunk["key"])[region(*met, chunk["offsets"])])
        view[region(*met, offsets)] = backend.to_device_array(part, backend.device_of_array(view))
        covered += int(np.prod(met[1], dtype=np.int64))
    if covered < needed:
        raise CheckpointFormatError(f"{directory}: the saved chunks of {name!r} cover {covered} of the {needed} "
                                    f"elements at offsets {offsets} this rank needs (incomplete checkpoint)")


__all__ = ["save", "load", "verify", "read_metadata", "CheckpointFormatError", "METADATA", "shard_file"]
