"""The handle hook registrations return (graph nodes' pre-hooks, tensors' and modules' hooks)."""
from __future__ import annotations


class RemovableHandle:
    """Returned by hook registration; ``handle.remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_hook")

    def __init__(self, hooks, hook):
        self._hooks = hooks
        self._hook = hook

    def remove(self):
        try:
            self._hooks.remove(self._hook)
        except ValueError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


__all__ = ["RemovableHandle"]
