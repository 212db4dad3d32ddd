"""Hooks on the tensors Functions save for backward (torch.autograd.graph.saved_tensors_hooks): inside
``with saved_tensors_hooks(pack, unpack):`` every tensor a node saves is handed to ``pack(tensor)``, and whatever it
returns is kept instead; backward calls ``unpack(packed)`` for a tensor (or array) to use. Fully sharded data
parallel packs the gathered parameters this way, as a reference to their module's storage, so the graph holds no
copy of the whole parameters between forward and backward; offloading and compression work the same way.

Hooks nest (the innermost pair packs); they are per thread, and cost nothing while none is active.
"""
from __future__ import annotations

import threading


class _Hooks(threading.local):
    def __init__(self):
        self.stack = []


hooks = _Hooks()


class PackedSaved:
    """A saved tensor as a pack hook returned it; ``array()`` unpacks it (every time it is needed)."""

    __slots__ = ("packed", "unpack", "shape", "dtype")

    def __init__(self, packed, unpack, shape, dtype):
        self.packed, self.unpack, self.shape, self.dtype = packed, unpack, shape, dtype

    def array(self):
        out = self.unpack(self.packed)
        out = getattr(out, "array", out)
        if tuple(out.shape) != tuple(self.shape):
            raise RuntimeError(f"saved_tensors_hooks: unpack returned shape {tuple(out.shape)} for a tensor saved "
                               f"with shape {tuple(self.shape)}\nHINT: unpack must give back the tensor pack received")
        return out

    def copy(self):
        return self.array().copy()


class saved_tensors_hooks:
    """``pack_hook(tensor) -> anything`` runs when a Function saves ``tensor`` for backward;
    ``unpack_hook(packed) -> tensor`` when backward needs it back. A context manager class, as torch's, so that
    hook pairs such as ``save_on_cpu`` subclass it."""

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook

    def __enter__(self):
        hooks.stack.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc_info):
        hooks.stack.pop()
        return False


def pack(saved, tensors):
    """``saved`` entries (array, device, version, ref) with their arrays replaced by what the active pack hook
    returned for the tensors."""
    pack_hook, unpack_hook = hooks.stack[-1]
    out = []
    for entry, t in zip(saved, tensors):
        if entry is None:
            out.append(None)
            continue
        array = entry[0]
        out.append((PackedSaved(pack_hook(t), unpack_hook, tuple(array.shape), array.dtype),) + tuple(entry[1:]))
    return out


def unpacked(saved):
    """``saved`` entries with every packed array unpacked."""
    return [None if e is None else (e[0].array(),) + tuple(e[1:]) if type(e[0]) is PackedSaved else e for e in saved]


__all__ = ["saved_tensors_hooks", "PackedSaved"]
