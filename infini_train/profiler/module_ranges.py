"""Module ranges: while profiling, each ``nn.Module`` call of a model becomes a named range, so traces show the
ops of a forward nested in the module that ran them (``nn.Module: CausalSelfAttention transformer.h.0.attn``).

    with it.profiler.profile() as prof, it.profiler.module_ranges(model):
        model(x)

Forward hooks are added on entry and removed on exit; outside a profile the ranges record nothing."""
from __future__ import annotations

import contextlib
import threading

from ..autograd import observers


class _Ranges(threading.local):
    def __init__(self):
        self.stack = []  # per thread: [(module, open range)], innermost last


@contextlib.contextmanager
def module_ranges(model):
    local = _Ranges()

    def enter(name):
        def pre_hook(module, args):
            scope = observers.record(name, "module")
            scope.__enter__()
            local.stack.append((module, scope))
        return pre_hook

    def leave(module, args, output):
        s = local.stack
        while s:  # ranges of calls that raised were never closed: close them on the way out
            owner, scope = s.pop()
            scope.__exit__(None, None, None)
            if owner is module:
                break

    handles = []
    for path, module in model.named_modules():
        name = f"nn.Module: {type(module).__name__}" + (f" {path}" if path else "")
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["module_ranges"]
