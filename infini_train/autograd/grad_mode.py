"""Thread-local gradient mode and its guards.

Each thread starts with grad enabled, whatever other threads do. The guards are small classes that work as
``with`` blocks and as decorators, with or without parentheses (``@no_grad`` and ``@no_grad()``), and restore
the previous mode on exceptions. A decorated generator function runs under the guard each time it resumes,
and with the caller's mode between its yields, as in PyTorch.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading


class _GradState(threading.local):
    enabled = True  # class attributes: the defaults every new thread sees
    inference = False


_state = _GradState()


def is_grad_enabled() -> bool:
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    return _state.inference


def _set_enabled(mode: bool):
    _state.enabled = bool(mode)


def _wrap_generator(make_guard, func):
    @functools.wraps(func)
    def generator(*args, **kwargs):
        gen = func(*args, **kwargs)
        try:
            with make_guard():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with make_guard():
                        gen.close()
                    raise
                except BaseException:
                    with make_guard():
                        response = gen.throw(*sys.exc_info())
                else:
                    with make_guard():
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value

    return generator


class _Guard:
    """Base for guards: ``_enter`` sets the mode and returns what ``_exit`` needs to restore it."""

    def _enter(self):
        raise NotImplementedError

    def _exit(self, saved):
        raise NotImplementedError

    def _clone(self):
        raise NotImplementedError

    def __enter__(self):
        self._saved = self._enter()
        return self

    def __exit__(self, *exc):
        self._exit(self._saved)
        return False

    def __call__(self, func):
        if inspect.isgeneratorfunction(func):
            return _wrap_generator(self._clone, func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            saved = self._enter()
            try:
                return func(*args, **kwargs)
            finally:
                self._exit(saved)

        return wrapper


class _SetMode(_Guard):
    """A guard setting grad mode to ``mode`` on each entry (also what a decorated generator re-enters)."""

    def __init__(self, mode):
        self.mode = mode

    def _enter(self):
        prev = _state.enabled
        _state.enabled = self.mode
        return prev

    def _exit(self, prev):
        _state.enabled = prev


class _GradModeGuard(_SetMode):
    """A guard with a fixed ``mode``, usable bare as a decorator: ``@no_grad`` as well as ``@no_grad()``."""

    mode: bool = True

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        if not callable(orig_func):
            raise TypeError(f"{cls.__name__}() takes no arguments (or the function it decorates), "
                            f"got {type(orig_func).__name__}")
        return cls()(orig_func)

    def __init__(self, orig_func=None):
        pass  # the mode is the class's

    def _clone(self):
        return type(self)()


class no_grad(_GradModeGuard):
    """Disable graph recording: ``with no_grad():``, ``@no_grad()`` or ``@no_grad``."""

    mode = False


class enable_grad(_GradModeGuard):
    """Enable graph recording inside a no_grad region."""

    mode = True


class set_grad_enabled(_SetMode):
    """Set grad mode to ``mode``. Takes effect at once (like PyTorch), and as a guard restores it on exit."""

    def __init__(self, mode: bool):
        self._prev = _state.enabled
        self.mode = bool(mode)
        _state.enabled = self.mode

    def _clone(self):
        return _SetMode(self.mode)

    def __enter__(self):
        self._saved = self._prev
        return self

    def __call__(self, func):
        _state.enabled = self._prev  # used as a decorator: only the wrapped call changes the mode
        return super().__call__(func)


class inference_mode(_Guard):
    """``with inference_mode():`` (or ``@inference_mode`` / ``@inference_mode()``): no graph is recorded, as
    under no_grad, for inference code. ``inference_mode(False)`` leaves the mode as it is."""

    def __new__(cls, mode=True):
        if callable(mode):  # bare decorator
            return cls()(mode)
        return super().__new__(cls)

    def __init__(self, mode=True):
        if callable(mode):
            return
        self.mode = bool(mode)

    def _clone(self):
        return inference_mode(self.mode)

    def _enter(self):
        saved = _state.enabled, _state.inference
        if self.mode:
            _state.enabled, _state.inference = False, True
        return saved

    def _exit(self, saved):
        _state.enabled, _state.inference = saved
