"""Work: the handle of one asynchronous collective, and the collective timeout.

A Work polls a backend's completion test (``MPI_Request.Test``, ``cudaEventQuery``). ``wait()`` spins on
that test, as MPI's own blocking calls do, so communication progresses at full speed; once a collective has
been pending for a second (a late peer) it polls with short sleeps instead. When a node runs more ranks than it
has cores, a waiting rank yields its core between polls, so the peer it waits for can run. Past the timeout it raises a
RuntimeError naming the collective, the group's ranks and this rank: a hang becomes an error. With a hang directory
set (``set_hang_dir``, which a training run does), the error also names the ranks that never arrived, and every rank
writes its Python stacks and pending collective there first (distributed/hang.py).

Each Work carries its launch (``Launch``: the collective, its sequence number on the group, the bytes this rank
handed over, the peer of a transfer), which ProcessGroup's collectives set while they start it. The time this rank
spends blocked in ``wait()`` adds up in ``comm_wait_seconds()`` (one clock reading per wait that had to wait): the
straggler report's communication wait (training/stragglers.py).
"""
from __future__ import annotations

import datetime
import os
import time

from ..autograd import observers
from . import waits
from .waits import human_bytes

DEFAULT_TIMEOUT = 300.0
TIMEOUT_ENV = "INFINI_TRAIN_COLLECTIVE_TIMEOUT"
_SPIN_SECONDS = 1.0  # busy-poll this long before backing off to sleeps (MPI progresses only while polled)
_MAX_SLEEP = 1e-3
_oversubscribed = False
_comm_wait = 0.0  # seconds this process spent in Work.wait on operations not yet complete
_launch = None  # the Launch of the collective being started (set by ProcessGroup's collectives while they run)


class Launch:
    """One started collective or transfer: ``name``, ``group`` (the ProcessGroup it was called on), ``sequence``
    (its number among the collectives of that group, 1 for the first; None for a send or receive, which the two
    ranks count differently), ``nbytes`` (what this rank handed over) and ``peer`` (a transfer's world rank)."""

    __slots__ = ("name", "group", "sequence", "nbytes", "peer")

    def __init__(self, name, group, sequence, nbytes, peer=None):
        self.name, self.group, self.sequence, self.nbytes, self.peer = name, group, sequence, nbytes, peer

    def describe(self):
        """E.g. "sequence 57 on this group, 4.0 MB" (a transfer: "4.0 MB")."""
        size = human_bytes(self.nbytes)
        return size if self.sequence is None else f"sequence {self.sequence} on this group, {size}"


def comm_wait_seconds():
    """Seconds this process has spent so far blocked in Work.wait (operations that were not yet complete)."""
    return _comm_wait


def set_oversubscribed(flag):
    """Whether this node runs more ranks than cores (set when the world starts): waits then yield between polls."""
    global _oversubscribed
    _oversubscribed = bool(flag)


def resolve_timeout(timeout=None) -> float:
    """Seconds from ``timeout`` (number or timedelta), else from $INFINI_TRAIN_COLLECTIVE_TIMEOUT, else 300."""
    source = "timeout"
    if timeout is None:
        timeout = os.environ.get(TIMEOUT_ENV)
        source = TIMEOUT_ENV
        if timeout is None:
            return DEFAULT_TIMEOUT
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(f"collective timeout: expected a positive number of seconds, got {source}={timeout!r}\n"
                         f"HINT: init_process_group(timeout=600) or export {TIMEOUT_ENV}=600")
    return seconds


class Work:
    """Handle of a collective started with ``async_op=True``.

    ``is_completed()`` polls without blocking; ``wait(timeout=None)`` blocks until the operation finished
    and its result is in the output tensors, returns True, and raises RuntimeError if the operation failed
    or did not finish within the group's timeout.
    """

    __slots__ = ("_group", "_name", "_test", "_finish", "_keep", "_on_timeout", "_done", "_error", "timeout",
                 "launch")

    def __init__(self, group, name, test, finish=None, keep=None, on_timeout=None):
        self._group = group  # for messages: its ranks, this rank, its backend
        self._name = name  # the collective, e.g. "all_reduce" or "send to 1"
        self._test = test  # returns True once the operation completed (may raise on failure)
        self._finish = finish  # runs once after completion: copy back to the tensor, divide for AVG
        self._keep = keep  # buffers that must stay alive while the operation runs
        self._on_timeout = on_timeout  # e.g. abort the NCCL communicator so no kernel stays stuck
        self._done = False
        self._error = None
        self.timeout = group.timeout if group is not None else DEFAULT_TIMEOUT
        self.launch = _launch  # the collective's Launch (None outside ProcessGroup's collectives)

    @property
    def describe(self):
        return self._name if self._group is None else self._group.describe(self._name)

    def is_completed(self) -> bool:
        """True once the operation finished (successfully or not); polling also drives MPI progress."""
        if not self._done:
            try:
                if not self._test():
                    return False
                if self._finish is not None:
                    self._finish()
            except Exception as exc:  # MPI/NCCL errors surface from the test or the copy back
                self._error = exc
            self._done = True
            self._test = self._finish = self._keep = self._on_timeout = None
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=None) -> bool:
        if not self._done and observers.ACTIVE:  # the profiler shows the time spent waiting
            backend = self._group.backend if self._group is not None else "work"
            with observers.record(f"{backend}:wait", "collective"):
                return self._wait(timeout)
        return self._wait(timeout)

    def _wait(self, timeout):
        global _comm_wait
        if not self._done:
            limit = self.timeout if timeout is None else resolve_timeout(timeout)
            start = time.monotonic()
            waits.waiting = (self, start)  # what a hang report says this rank waits in
            pause = 0.0
            try:
                while not self.is_completed():
                    now = time.monotonic()
                    if now - start > limit:
                        raise self._timed_out(limit)
                    if now - start > _SPIN_SECONDS:
                        time.sleep(pause)
                        pause = min(2 * pause + 1e-5, _MAX_SLEEP)
                    elif _oversubscribed:
                        os.sched_yield()
            finally:
                waits.waiting = None
                _comm_wait += time.monotonic() - start
        if self._error is not None:
            raise RuntimeError(f"{self.describe} failed: {self._error}") from self._error
        return True

    def _timed_out(self, limit):
        if self._on_timeout is not None:
            try:
                self._on_timeout()
            except Exception:  # the timeout error below is the one that matters
                pass
        from . import hang

        details = hang.report_timeout(self, limit)  # with a hang directory: every rank's stacks, who never arrived
        return RuntimeError(
            f"{self.describe} did not complete within {limit:g} s{details}\n"
            "HINT: another rank of the group never joined this collective: it crashed, hangs, is still busy, or "
            "called collectives in a different order. To wait longer, pass init_process_group(timeout=SECONDS) "
            f"or export {TIMEOUT_ENV}=SECONDS")

    def __repr__(self):
        state = "failed" if self._error is not None else ("completed" if self._done else "pending")
        return f"<Work {self._name} {state}>"


class CompletedWork(Work):
    """An operation that finished at once (a world of one process)."""

    __slots__ = ()

    def __init__(self, group=None, name="collective", finish=None):
        super().__init__(group, name, _always_done, finish)
        self.is_completed()


def _always_done():
    return True


__all__ = ["Work", "CompletedWork", "Launch", "DEFAULT_TIMEOUT", "TIMEOUT_ENV", "resolve_timeout", "comm_wait_seconds"]
