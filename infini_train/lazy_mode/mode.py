"""Lazy mode's switch: thread-local, nestable, and free for code that never enters it.

``ACTIVE`` holds one token per thread currently in lazy mode; ``Function.apply`` tests its truthiness (one list
check per op) before it reads the thread-local ``_state``, so eager code pays nothing more while no thread is
lazy, and a thread that is not lazy keeps eager semantics while another one is.
"""
from __future__ import annotations

import threading
import weakref

ACTIVE = []  # one entry per thread in lazy mode (replaced whole, so readers never see a half-updated list)
_lock = threading.Lock()


class _LazyState(threading.local):
    enabled = False  # ops record instead of computing
    pending = None  # weak references to this thread's recorded, not yet realised nodes
    pruned_at = 64  # prune dead references once ``pending`` grows past this


_state = _LazyState()


def is_lazy_enabled() -> bool:
    """Whether ops in this thread record their graph instead of computing (inside ``with lazy():``)."""
    return _state.enabled


def _set_enabled(mode):
    """Switch this thread's mode; returns the previous one."""
    prev = _state.enabled
    if mode == prev:
        return prev
    token = threading.get_ident()
    with _lock:
        if mode:
            ACTIVE[:] = [*ACTIVE, token]
        else:
            rest = list(ACTIVE)
            rest.remove(token)
            ACTIVE[:] = rest
    _state.enabled = mode
    return prev


def track(node):
    """Remember ``node`` as pending in this thread (leaving lazy mode realises what is still referenced)."""
    pending = _state.pending
    if pending is None:
        pending = _state.pending = []
    pending.append(weakref.ref(node))
    if len(pending) > _state.pruned_at:
        pending[:] = [r for r in pending if (n := r()) is not None and not n.done]
        _state.pruned_at = max(64, 2 * len(pending))


def take_pending():
    """This thread's live pending nodes, forgetting them."""
    pending = _state.pending or []
    _state.pending = None
    _state.pruned_at = 64
    return [n for r in pending if (n := r()) is not None and not n.done]


def live_pending():
    """This thread's live pending nodes (kept)."""
    return [n for r in (_state.pending or ()) if (n := r()) is not None and not n.done]


class suspended:
    """Run eagerly inside: how a lazy node is computed (a custom Function's forward calls ops on Tensors)."""

    __slots__ = ("prev",)

    def __enter__(self):
        self.prev = _state.enabled
        _state.enabled = False  # ACTIVE keeps this thread's token: flips within a thread need no lock

    def __exit__(self, *exc):
        _state.enabled = self.prev
        return False


class lazy:
    """``with it.lazy():`` ops record their graph instead of computing; a tensor is computed when its value is
    needed (``.numpy()``, ``.item()``, ``print``, ``backward``, any use of its array) and, on leaving the block,
    every recorded tensor still referenced is. Results equal eager mode bit for bit. ``lazy(False)`` turns the
    mode off inside a lazy block (already recorded tensors stay lazy until needed). Thread-local and nestable."""

    def __init__(self, mode=True):
        self.mode = bool(mode)
        self.prev = None

    def __enter__(self):
        self.prev = _set_enabled(self.mode)
        return self

    def __exit__(self, exc_type, exc, tb):
        _set_enabled(self.prev)
        if self.mode and not self.prev and exc_type is None:
            from .graph import realize_pending
            realize_pending()
        return False

    # it.lazy is this class: the helpers are reachable from it (it.lazy.realize, it.lazy.fusion_stats, ...)
    @staticmethod
    def realize(*tensors):
        """Compute the given tensors now; returns them (one tensor when one is given)."""
        from .graph import realize
        return realize(*tensors)

    @staticmethod
    def realize_all():
        """Compute every pending tensor of this thread that is still referenced (before an optimizer step or
        other writes that bypass the tensor API inside a lazy block)."""
        from .graph import realize_all
        realize_all()

    @staticmethod
    def fusion_stats():
        """Counters since the last ``reset_fusion_stats()``: fused groups, fused nodes and blocks run."""
        from .fusion import fusion_stats
        return fusion_stats()

    @staticmethod
    def reset_fusion_stats():
        from .fusion import reset_stats
        reset_stats()

    is_enabled = staticmethod(is_lazy_enabled)

    def __call__(self, func):
        import functools

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with lazy(self.mode):
                return func(*args, **kwargs)

        return wrapper
