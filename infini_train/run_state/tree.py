"""Nested state (dicts, lists, tuples holding arrays and plain values, as optimizer state dicts are) split into
{dotted key: array} plus a JSON-able skeleton with array placeholders, and joined back: how checkpoints store
optimizer state and param group options."""
from __future__ import annotations

import numpy as np


def to_numpy(value):
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value


def flatten_state(state, prefix=""):
    """Split a nested dict/list into ({dotted key: array}, JSON-able skeleton with array placeholders)."""
    arrays = {}

    def walk(node, path):
        node = to_numpy(node)
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


__all__ = ["flatten_state", "unflatten_state", "to_numpy"]
