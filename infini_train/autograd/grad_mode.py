"""Thread-local gradient mode and its guards.

Each thread starts with grad enabled, whatever other threads do. The guards are small classes that work
both as ``with`` blocks and as decorators, and restore the previous mode on exceptions.
"""
from __future__ import annotations

import functools
import threading


class _GradState(threading.local):
    enabled = True  # class attribute: the default every new thread sees


_state = _GradState()


def is_grad_enabled() -> bool:
    return _state.enabled


def _set_enabled(mode: bool):
    _state.enabled = bool(mode)


class _GradModeGuard:
    """Base for guards: sets a mode on entry, restores the previous mode on exit."""

    mode: bool = True

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, func):
        mode = self.mode

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            prev = _state.enabled
            _state.enabled = mode
            try:
                return func(*args, **kwargs)
            finally:
                _state.enabled = prev

        return wrapper


class no_grad(_GradModeGuard):
    """Disable graph recording: ``with no_grad():`` or ``@no_grad()``."""

    mode = False


class enable_grad(_GradModeGuard):
    """Enable graph recording inside a no_grad region."""

    mode = True


class set_grad_enabled(_GradModeGuard):
    """Set grad mode to ``mode``. Takes effect at once (like PyTorch), and as a guard restores it on exit."""

    def __init__(self, mode: bool):
        self._prev = _state.enabled
        self.mode = bool(mode)
        _state.enabled = self.mode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, func):
        _state.enabled = self._prev  # used as a decorator: only the wrapped call changes the mode
        return super().__call__(func)
