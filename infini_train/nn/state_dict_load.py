"""Module.load_state_dict's walk, in torch's order: each module (parent before children) runs its load pre-hooks on
the entries under its prefix, takes its own parameters and persistent buffers and notes its missing and unexpected
keys; its load post-hooks run once its subtree is done. Values are copied only when nothing failed, or before a
post-hook runs (it may read them, as in torch)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import backend
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


class LoadWalk:
    def __init__(self, metadata, keys_type):
        self.metadata = metadata
        self.keys_type = keys_type  # Module's IncompatibleKeys
        self.missing, self.unexpected, self.errors = [], [], []
        self.size_errors = []
        self.pending = []  # (target, value) not yet copied

    def visit(self, module, state, prefix):
        local_metadata = {} if self.metadata is None else self.metadata.get(prefix[:-1], {})
        for hook in list(module._load_state_dict_pre_hooks):
            hook(module, state, prefix, local_metadata, True, self.missing, self.unexpected, self.errors)
        local = OrderedDict((n, p) for n, p in module._parameters.items() if p is not None)
        local.update((n, b) for n, b in module._buffers.items() if b is not None and n not in module._non_persistent)
        for name, target in local.items():
            key = prefix + name
            if key not in state:
                self.missing.append(key)
                continue
            value = state[key]
            if not backend.is_array_like(value):
                value = np.asarray(value)
            if tuple(value.shape) != tuple(target.shape):
                self.size_errors.append(f"  size mismatch for {key}: expected shape {tuple(target.shape)}, "
                                        f"got {tuple(value.shape)}")
                continue
            self.pending.append((target, value))
        for key in state:  # torch computes unexpected keys whatever ``strict`` is
            if not key.startswith(prefix):
                continue
            head, *rest = key[len(prefix):].split(".", 1)
            if (rest and head not in module._modules) or (not rest and head not in local):
                self.unexpected.append(key)
        for name, child in module._modules.items():
            if child is not None:
                child_prefix = prefix + name + "."
                self.visit(child, {k: v for k, v in state.items() if k.startswith(child_prefix)}, child_prefix)
        if module._load_state_dict_post_hooks:
            self.copy_pending()
            keys = self.keys_type(self.missing, self.unexpected)
            for hook in list(module._load_state_dict_post_hooks):
                if hook(module, keys) is not None:
                    raise AssertionError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not expected to return "
                        "new values, if incompatible_keys need to be modified, it should be done inplace.")

    def copy_pending(self):
        with no_grad():
            for target, value in self.pending:
                flat_shard = target.placement.flat_shard
                if flat_shard is not None:
                    flat_shard.load_param(target, value)
                    continue
                if not isinstance(value, Tensor):
                    value = backend.to_device_array(value, target.device)
                target.copy_(value)
        self.pending = []
