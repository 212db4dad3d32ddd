"""Training checkpoints: tensors in safetensors, everything else in JSON. Never pickle.

Layout: ``out_dir/checkpoints/step_000100/`` holding ``model.safetensors``, ``optimizer.safetensors`` and
``state.json`` (step, config, RNG states, data position, optimizer scalars). A checkpoint is written
into a temporary directory and renamed into place, so a crash mid-write leaves the previous ones intact;
``state.json`` is written last and its presence marks a complete checkpoint.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import numpy as np

CHECKPOINT_DIR = "checkpoints"
STEP_PATTERN = re.compile(r"^step_(\d{6,})$")


class CheckpointError(ValueError):
    """A checkpoint that is missing or cannot be read: names the path and what is wrong."""


def _to_numpy(value):
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value


def flatten_state(state, prefix=""):
    """Split a nested dict/list into ({dotted key: array}, JSON-able skeleton with array placeholders)."""
    arrays = {}

    def walk(node, path):
        node = _to_numpy(node)
        if isinstance(node, np.ndarray):
            arrays[path] = np.ascontiguousarray(node)
            return {"__array__": path}
        if isinstance(node, dict):
            return {"__dict__": [[_key(k), walk(v, f"{path}.{k}" if path else str(k))] for k, v in node.items()]}
        if isinstance(node, (list, tuple)):
            return {"__list__": [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node)],
                    "tuple": isinstance(node, tuple)}
        if isinstance(node, np.generic):
            return node.item()
        return node

    return arrays, walk(state, prefix)


def _key(k):
    return {"int": k} if isinstance(k, int) else k


def unflatten_state(skeleton, arrays):
    def walk(node):
        if isinstance(node, dict):
            if "__array__" in node:
                return arrays[node["__array__"]]
            if "__dict__" in node:
                return {(k["int"] if isinstance(k, dict) else k): walk(v) for k, v in node["__dict__"]}
            if "__list__" in node:
                items = [walk(v) for v in node["__list__"]]
                return tuple(items) if node.get("tuple") else items
        return node

    return walk(skeleton)


def step_dir(out_dir, step):
    return os.path.join(out_dir, CHECKPOINT_DIR, f"step_{step:06d}")


def save_checkpoint(out_dir, step, model_state, optimizer_state, extra, keep_last=None):
    """Write checkpoint ``step`` atomically; returns its directory. ``extra`` must be JSON-serialisable."""
    from safetensors.numpy import save_file

    root = os.path.join(out_dir, CHECKPOINT_DIR)
    os.makedirs(root, exist_ok=True)
    final = step_dir(out_dir, step)
    tmp = tempfile.mkdtemp(dir=root, prefix=f".tmp-step_{step:06d}-")
    try:
        model_arrays = {k: np.ascontiguousarray(_to_numpy(v)) for k, v in model_state.items()}
        save_file(_dedupe(model_arrays), os.path.join(tmp, "model.safetensors"))
        opt_arrays, opt_skeleton = flatten_state(optimizer_state)
        save_file(opt_arrays, os.path.join(tmp, "optimizer.safetensors"))
        state = {"step": step, "optimizer": opt_skeleton, "model_keys": list(model_arrays), **extra}
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(state, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last:
        for old in list_checkpoints(out_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _dedupe(arrays):
    """safetensors refuses shared memory (tied weights): store a copy under each name."""
    seen = {}
    out = {}
    for k, v in arrays.items():
        key = (v.__array_interface__["data"][0], v.shape)
        out[k] = v.copy() if key in seen else v
        seen[key] = k
    return out


def list_checkpoints(out_dir):
    """Complete checkpoints (those with state.json) under out_dir, oldest first."""
    root = os.path.join(out_dir, CHECKPOINT_DIR)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = STEP_PATTERN.match(name)
        path = os.path.join(root, name)
        if m and os.path.exists(os.path.join(path, "state.json")):
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir):
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def resolve_checkpoint(path_or_out_dir):
    """A checkpoint directory from an explicit step dir or from an out_dir (its newest checkpoint)."""
    path = os.fspath(path_or_out_dir)
    if os.path.exists(os.path.join(path, "state.json")):
        return path
    newest = latest_checkpoint(path)
    if newest is None:
        raise CheckpointError(f"no checkpoint found at {path}\nHINT: pass a checkpoints/step_XXXXXX directory or "
                              "a run's out_dir that contains one")
    return newest


def load_checkpoint(path):
    """Returns (model_state {name: array}, optimizer_state, state dict from state.json)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = resolve_checkpoint(path)
    try:
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        model_state = load_file(os.path.join(path, "model.safetensors"))
        opt_arrays = load_file(os.path.join(path, "optimizer.safetensors"))
    except (OSError, json.JSONDecodeError, SafetensorError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}\nHINT: it may be incomplete or corrupted; "
                              "resume from an earlier one") from exc
    optimizer_state = unflatten_state(state.pop("optimizer"), opt_arrays)
    return model_state, optimizer_state, state
