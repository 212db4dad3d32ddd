"""Op observers: how the profiler and the precision checker see every Function's forward and backward, and the
named ranges (collectives, optimizer steps, user code) around them.

An observer is any object with these methods (``OpObserver`` gives no-op defaults):
- ``forward_begin(fn, inputs) -> token`` / ``forward_end(token, fn, inputs, outputs)`` around ``Function.apply``
  (``outputs``: the Tensor or tuple apply returns; ``fn.device`` is set by then);
- ``backward_begin(fn, grad_outputs) -> token`` / ``backward_end(token, fn, grad_inputs)`` around a node's backward
  (``grad_outputs``: the arrays (Tensors under create_graph) arriving per output, None where none came;
  ``grad_inputs``: the list of ``(next_function, grad, input_index)`` handed on);
- ``range_begin(name, kind) -> token`` / ``range_end(token)`` around ``record(name, kind)`` blocks.

Calls come from whichever thread runs the op (DataParallel replicas run in threads). With no observer installed
the cost is one truthiness test of ``ACTIVE`` per op.
"""
from __future__ import annotations

import threading

from .grad_sum import RowUpdates, dense

ACTIVE = []  # the installed observers, in installation order
_lock = threading.Lock()


class OpObserver:
    """Base class with no-op callbacks; subclass and override what you need."""

    def forward_begin(self, fn, inputs):
        return None

    def forward_end(self, token, fn, inputs, outputs):
        pass

    def backward_begin(self, fn, grad_outputs):
        return None

    def backward_end(self, token, fn, grad_inputs):
        pass

    def range_begin(self, name, kind):
        return None

    def range_end(self, token):
        pass


def install(observer):
    """Start calling ``observer``; returns it. Installing the same observer twice is an error."""
    with _lock:
        if any(o is observer for o in ACTIVE):
            raise RuntimeError(f"observers.install: {observer!r} is already installed\nHINT: uninstall it first")
        ACTIVE[:] = [*ACTIVE, observer]  # replaced whole: a thread iterating the old list is not disturbed
    return observer


def uninstall(observer):
    """Stop calling ``observer`` (a no-op when it is not installed)."""
    with _lock:
        ACTIVE[:] = [o for o in ACTIVE if o is not observer]


def observed_apply(fn, inputs, run):
    """``run()`` (Function.apply's body) between every observer's forward_begin and forward_end."""
    observers = tuple(ACTIVE)
    tokens = [o.forward_begin(fn, inputs) for o in observers]
    outputs = run()
    for o, token in zip(reversed(observers), reversed(tokens)):
        o.forward_end(token, fn, inputs, outputs)
    return outputs


def observed_backward(fn, run):
    """``run()`` (a node's backward) between every observer's backward_begin and backward_end."""
    observers = tuple(ACTIVE)
    grad_outputs = list(fn.grad_outputs) if fn.grad_outputs is not None else []
    tokens = [o.backward_begin(fn, grad_outputs) for o in observers]
    grad_inputs = run()
    seen = grad_inputs
    if any(type(g) is RowUpdates for _, g, _ in grad_inputs):  # observers see an embedding's gradient dense
        seen = [(nxt, dense(g), i) for nxt, g, i in grad_inputs]
    for o, token in zip(reversed(observers), reversed(tokens)):
        o.backward_end(token, fn, seen)
    return grad_inputs


class _Range:
    __slots__ = ("name", "kind", "entered")

    def __init__(self, name, kind):
        self.name, self.kind, self.entered = name, kind, ()

    def __enter__(self):
        observers = tuple(ACTIVE)
        self.entered = [(o, o.range_begin(self.name, self.kind)) for o in observers]
        return self

    def __exit__(self, *exc):
        for o, token in reversed(self.entered):
            o.range_end(token)
        return False


class _NoRange:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_RANGE = _NoRange()


def record(name, kind="user"):
    """A context manager marking a named range (``kind``: "user", "collective", "optimizer", "p2p", ...) for the
    installed observers; nothing at all when none is installed."""
    return _Range(name, kind) if ACTIVE else _NO_RANGE


__all__ = ["ACTIVE", "OpObserver", "install", "uninstall", "record", "observed_apply", "observed_backward"]
