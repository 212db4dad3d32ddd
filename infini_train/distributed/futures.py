"""Future: a value that an asynchronous collective produces, in the shape of torch.futures.Future (what DDP
communication hooks return). ``wait()`` waits for the collective (a Work, or nothing: already done) and returns the
value; ``value()`` the same; ``then(fn)`` a Future whose value is ``fn(this future)``, computed when it is
waited on; ``done()`` polls."""
from __future__ import annotations


class Future:
    def __init__(self, work=None, value=None, produce=None):
        self._work = work  # the Work that makes the value ready (None: ready now)
        self._value = value
        self._produce = produce  # runs once the work is done: returns the value
        self._ready = work is None and produce is None

    def done(self):
        return self._ready or self._work is None or self._work.is_completed()

    def wait(self):
        if not self._ready:
            if self._work is not None:
                self._work.wait()
            if self._produce is not None:
                self._value = self._produce()
            self._ready, self._work, self._produce = True, None, None
        return self._value

    def value(self):
        return self.wait()

    def then(self, callback):
        """A Future whose value is ``callback(self)`` (torch's chaining), computed when it is waited on."""
        def produce():
            self.wait()
            return callback(self)

        return Future(produce=produce)

    def set_result(self, value):
        self._value, self._ready, self._work, self._produce = value, True, None, None


def completed(value):
    """A Future that already holds ``value``."""
    return Future(value=value)


__all__ = ["Future", "completed"]
