"""Stragglers: each rank's step split into compute, communication wait and data wait, and every ``train.log_every``
steps rank 0 names the slowest rank against the median; the run's side of the hang reports; two test hooks.

The timers are the run's own, per rank and per step:

- data wait: the time the step spends fetching its batches (``StepResult.data_wait_s``, step.py);
- communication wait: the time the step spends blocked in ``Work.wait`` (``dist.comm_wait_seconds()``, work.py): every
  collective and transfer, synchronous ones included, waits there (one clock reading per wait);
- compute: the rest of the step's wall time.

In a synchronous step every rank's wall time is about the same: the ranks that are done early wait for the slowest
one in their next collective. What tells the straggler apart is the time a rank works, its step time less its
communication wait (compute + data wait): the report's ``step`` is that, the mean over the window's steps. The window
is the steps since the previous report; a report comes with the step lines (steps where ``step % log_every == 0``,
and the last step), after one ``all_gather`` over the world of four numbers per rank (nothing on the other steps).
Every window writes ``{"straggler": {...}}`` into that step's metrics.jsonl record::

    {"rank": 3, "step_s": 1.84, "median_s": 1.12, "ratio": 1.64, "compute_s": 1.71, "data_wait_s": 0.13,
     "comm_wait_s": 0.01, "wall_s": 1.85, "others_comm_wait_s": 0.72, "steps": [10, 19], "flagged": true}

(``steps``: the window's first and last step as metrics.jsonl numbers them). The line is printed only when the slowest
rank is ``flagged``: its step at least THRESHOLD (1.2) times the median and MIN_GAP_S (10 ms) above it::

    straggler: rank 3 step 1.84 s vs median 1.12 s (compute 1.71 s, data wait 0.13 s: compute dominates; the others
    wait 0.72 s for it in communication), mean of steps 11-20

A pipeline's stages differ in work by design (the last one computes the loss head), so its last stage can be named in
every window: that is its imbalance, not a fault. With NCCL's stream-only waits (INFINI_TRAIN_NCCL_BLOCKING_WAIT=0) the
host does not wait for collectives, so the communication wait is not seen there.

In a world of one process there is nothing to compare: no timer, no collective, no record.

In a world of several ranks the run also sets the hang directory, ``out_dir/hang`` (distributed/hang.py): a collective
or transfer that times out makes every rank write its stacks and pending collective there, and the error names the
ranks that never arrived.

Test hooks (environment; the run refuses values it cannot read):

- ``INFINI_TRAIN_SLOW_RANK=R:SECONDS``: rank R sleeps SECONDS at the start of every step, inside the step's compute
  (it is the straggler; the others wait for it in communication);
- ``INFINI_TRAIN_HANG_RANK=R:STEP[:SECONDS]``: rank R sleeps SECONDS (default 3600) at the start of step STEP (as
  metrics.jsonl numbers steps): the others' next collective times out (INFINI_TRAIN_COLLECTIVE_TIMEOUT), which ends the
  job with every rank's stack in out_dir/hang.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from .. import distributed as dist
from ..distributed.work import comm_wait_seconds
from ..tensor import Tensor
from .config import ConfigError

THRESHOLD = 1.2  # the slowest rank's step against the median that prints the line
MIN_GAP_S = 0.01  # ... and by at least this much (tiny steps jitter by more than 20%)
SLOW_ENV = "INFINI_TRAIN_SLOW_RANK"
HANG_ENV = "INFINI_TRAIN_HANG_RANK"
HANG_SECONDS = 3600.0


def _hook(name, value, world, parts, example):
    """``value`` of the test hook ``name`` split at ':' into a rank in [0, world) and numbers >= 0 (``parts``: 2 or
    2..3 fields); a ConfigError naming the variable, what was expected and what it got."""
    fields = value.split(":")
    low, high = parts
    try:
        if not low <= len(fields) <= high:
            raise ValueError
        rank, numbers = int(fields[0]), [float(f) for f in fields[1:]]
    except ValueError:
        rank, numbers = None, []
    if rank is None or not 0 <= rank < world or not all(0 <= n < float("inf") for n in numbers):
        raise ConfigError(f"{name}: expected {example}, with RANK in [0, {world}) (the world's ranks) and numbers "
                          f">= 0, got {value!r}\nHINT: unset {name} (a test hook) or fix it, e.g. "
                          f"{name}={example.split(' ')[0].replace('RANK', str(world - 1))}")
    return rank, numbers


def slow_rank(world, environ=os.environ):
    """(rank, seconds) from $INFINI_TRAIN_SLOW_RANK, or None."""
    value = environ.get(SLOW_ENV)
    if not value:
        return None
    rank, (seconds,) = _hook(SLOW_ENV, value, world, (2, 2), "RANK:SECONDS (e.g. 1:0.3: rank 1 sleeps 0.3 s per step)")
    return rank, seconds


def hang_rank(world, environ=os.environ):
    """(rank, step, seconds) from $INFINI_TRAIN_HANG_RANK, or None."""
    value = environ.get(HANG_ENV)
    if not value:
        return None
    rank, numbers = _hook(HANG_ENV, value, world, (2, 3),
                          "RANK:STEP[:SECONDS] (e.g. 1:3: rank 1 sleeps an hour at step 3)")
    if numbers[0] != int(numbers[0]):
        raise ConfigError(f"{HANG_ENV}: expected RANK:STEP[:SECONDS] with a whole STEP, got {value!r}")
    return rank, int(numbers[0]), numbers[1] if len(numbers) > 1 else HANG_SECONDS


def summarize(rows, first_step, last_step):
    """The straggler record of a window: ``rows`` holds each rank's mean (wall, communication wait, data wait) per
    step, in seconds, by rank."""
    busy = [max(wall - comm, 0.0) for wall, comm, _ in rows]
    slowest = max(range(len(rows)), key=busy.__getitem__)
    median = statistics.median(busy)
    wall, comm, data = rows[slowest]
    step = busy[slowest]
    others = [row[1] for r, row in enumerate(rows) if r != slowest]
    flagged = step >= THRESHOLD * median and step - median >= MIN_GAP_S
    return {"rank": slowest, "step_s": _r(step), "median_s": _r(median),
            "ratio": _r(step / median) if median > 0 else None, "compute_s": _r(max(step - data, 0.0)),
            "data_wait_s": _r(data), "comm_wait_s": _r(comm), "wall_s": _r(wall),
            "others_comm_wait_s": _r(statistics.median(others)) if others else 0.0,
            "steps": [first_step, last_step], "flagged": bool(flagged)}


def _r(seconds):
    return round(float(seconds), 6)


def describe(record):
    """The printed line of a straggler record ("" when it is not flagged)."""
    if not record.get("flagged"):
        return ""
    compute, data = record["compute_s"], record["data_wait_s"]
    first, last = record["steps"]
    steps = f"step {first + 1}" if first == last else f"steps {first + 1}-{last + 1}"
    return (f"straggler: rank {record['rank']} step {_s(record['step_s'])} vs median {_s(record['median_s'])} "
            f"(compute {_s(compute)}, data wait {_s(data)}: {'compute' if compute >= data else 'data wait'} "
            f"dominates; the others wait {_s(record['others_comm_wait_s'])} for it in communication), mean of "
            f"{steps}")


def _s(seconds):
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:.1f} s"


class _Off:
    """One process and no hook: nothing timed, nothing gathered."""

    def timing(self, step):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def end_step(self, step, result):
        return {}

    def describe(self, record):
        return ""


OFF = _Off()


def step_watch(cfg, rank, world):
    """The run's straggler timers and report (and, with several ranks, the hang directory out_dir/hang); a null
    object in one process without test hooks."""
    slow, hang = slow_rank(world), hang_rank(world)
    if world > 1:
        dist.set_hang_dir(os.path.join(cfg.out_dir, "hang"))
    report = world > 1 and cfg.train.straggler_report
    if not report and slow is None and hang is None:
        return OFF
    return StepWatch(cfg.train, rank, report, slow, hang)


class StepWatch:
    """Times each step (``with watch.timing(step):`` around train_step) and, every window, gathers and summarizes
    (``end_step``: the record's ``straggler`` entry, or {})."""

    def __init__(self, train_cfg, rank, report, slow=None, hang=None):
        self.rank, self.report = rank, report
        self.log_every, self.last = train_cfg.log_every, train_cfg.num_iterations - 1
        self.delay = slow[1] if slow is not None and slow[0] == rank else 0.0
        self.hang = hang if hang is not None and hang[0] == rank else None
        self.sums = np.zeros(3)  # the window's wall, communication wait, data wait
        self.steps = 0
        self.first = None
        self._start = self._comm = 0.0
        self.wall = self.comm = 0.0

    def timing(self, step):
        if self.hang is not None and step == self.hang[1]:
            print(f"[rank {self.rank}] {HANG_ENV}: sleeping {self.hang[2]:g} s at step {step} (a test hook)",
                  file=sys.stderr, flush=True)
            time.sleep(self.hang[2])
        return self

    def __enter__(self):
        self._start, self._comm = time.monotonic(), comm_wait_seconds()
        if self.delay:
            time.sleep(self.delay)  # inside the step: this rank's compute
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self._start
        self.comm = comm_wait_seconds() - self._comm
        return False

    def end_step(self, step, result):
        """Add the step to the window; at a window's end (the step lines' steps) gather every rank's means and
        return {"straggler": record} (every rank computes it; rank 0 writes it), else {}."""
        if not self.report:
            return {}
        comm = min(self.comm, self.wall)
        data = min(getattr(result, "data_wait_s", 0.0), self.wall - comm)
        self.sums += (self.wall, comm, data)
        self.steps += 1
        if self.first is None:
            self.first = step
        if step % self.log_every and step != self.last:
            return {}
        mine = Tensor(self.sums / self.steps)
        parts = [Tensor(np.zeros(3)) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, mine)
        record = summarize([tuple(p.numpy()) for p in parts], self.first, step)
        self.sums[:] = 0.0
        self.steps, self.first = 0, None
        return {"straggler": record}

    def describe(self, record):
        """"\\nstraggler: ..." for the step line of a window whose straggler is flagged, else ""."""
        line = describe(record.get("straggler", {}))
        return "\n" + line if line else ""


__all__ = ["step_watch", "StepWatch", "summarize", "describe", "slow_rank", "hang_rank", "THRESHOLD", "MIN_GAP_S",
           "SLOW_ENV", "HANG_ENV"]
