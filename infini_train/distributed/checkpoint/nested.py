"""Nested state dicts in sharded checkpoints, as torch.distributed.checkpoint takes them: ``{"model":
model.state_dict(), "optim": optimizer_state}`` is walked into entries named by their path (``"model/lm_head.weight"``,
``"optim/state/0/exp_avg"``), tensors written as pieces and the other values (a step count, the param groups' options)
kept as JSON in the metadata. Loading walks the caller's dict the same way: tensors are filled in place, the other
values replaced by the saved ones.

A leaf is a tensor (Tensor, ShardedTensor, LocalPieces or array) or a JSON value: None, bool, int, float, str, and
lists / tuples / dicts holding no tensor (a tuple comes back a tuple). Dicts and lists holding tensors are walked.
"""
from __future__ import annotations

import numpy as np

from ... import backend

from ..sharded_tensor import ShardedTensor
from .pieces import LocalPieces

SEPARATOR = "/"


def is_tensor(value):
    if isinstance(value, (ShardedTensor, LocalPieces)):
        return True
    return not isinstance(value, np.generic) and backend.is_array_like(value)


def _holds_tensor(value):
    if is_tensor(value):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def walk(state):
    """(tensors {path: value}, objects [(path, container, key, value)]) of ``state``: its tensor leaves and its other
    leaves with where they sit (so that loading can replace them)."""
    if not isinstance(state, dict):
        raise TypeError(f"sharded checkpoint: state must be a dict (a state dict, or a dict of them), got "
                        f"{type(state).__name__}\nHINT: save({{'model': model.state_dict()}}, directory)")
    tensors, objects, seen = {}, [], set()

    def leaf(path):
        if path in seen:
            raise ValueError(f"sharded checkpoint: two values are named {path!r} (a nested key and a key containing "
                             f"{SEPARATOR!r} meet)\nHINT: rename one of them")
        seen.add(path)
        return path

    def visit(value, path, container, key):
        if is_tensor(value):
            tensors[leaf(path)] = value
        elif isinstance(value, (dict, list)) and (path is None or _holds_tensor(value)):
            for k, v in (value.items() if isinstance(value, dict) else enumerate(value)):
                visit(v, str(k) if path is None else f"{path}{SEPARATOR}{k}", value, k)
        elif isinstance(value, tuple) and _holds_tensor(value):
            if not all(is_tensor(v) for v in value):
                raise TypeError(f"sharded checkpoint: {path!r} is a tuple mixing tensors and other values, which "
                                "cannot be loaded in place\nHINT: use a list or a dict")
            for k, v in enumerate(value):
                tensors[leaf(f"{path}{SEPARATOR}{k}")] = v
        else:
            objects.append((leaf(path), container, key, value))

    visit(state, None, None, None)
    return tensors, objects


def to_json(value, path):
    """``value`` as JSON can hold it (numpy scalars as Python numbers); raises naming ``path`` otherwise."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [to_json(v, f"{path}[{k}]") for k, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): to_json(v, f"{path}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"sharded checkpoint: {path!r} is a {type(value).__name__}; expected a tensor or a JSON value "
                    "(None, bool, int, float, str, and lists or dicts of them)\nHINT: convert it, or leave it out")


def restore(container, key, saved, like):
    """Put the saved JSON value back where ``like`` was (a tuple stays a tuple, int keys stay ints)."""
    container[key] = _like(saved, like)


def _like(saved, like):
    if isinstance(like, tuple) and isinstance(saved, list):
        return tuple(_like(s, v) for s, v in zip(saved, like)) + tuple(saved[len(like):])
    if isinstance(like, dict) and isinstance(saved, dict):
        keys = {str(k): k for k in like}
        return {keys.get(k, k): _like(v, like.get(keys.get(k, k))) for k, v in saved.items()}
    if isinstance(like, list) and isinstance(saved, list):
        return [_like(s, like[k] if k < len(like) else None) for k, s in enumerate(saved)]
    return saved


__all__ = ["walk", "to_json", "restore", "is_tensor", "SEPARATOR"]
