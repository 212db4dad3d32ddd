"""What a run's ranks hold: the bytes of their parameters, gradients and optimizer state, and the peak resident
memory of each phase of the run (build, checkpoint load, first step, steady state, checkpoint save).

A phase's peak is the kernel's high-water mark (VmHWM), reset when the phase starts (writing 5 to
/proc/self/clear_refs) and read when it ends; where the kernel refuses the reset, each figure is the peak since the
process started, and the report says so. On a GPU the peak of the device memory in use (cupy's memory pool) in
each phase is recorded beside it, and each phase's duration (its longest occurrence, on the slowest rank).
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from .. import distributed as dist
from ..tensor import Tensor

PHASES = ("build", "load", "first_step", "steady", "save")


def peak_rss_bytes():
    """This process's peak resident memory since the last reset (VmHWM; 0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss():
    """Start a new high-water mark; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class DevicePeak:
    """The most bytes cupy's memory pool had in use at once since the last ``reset``: the pool's allocations go
    through ``malloc`` here, which notes the bytes in use after each."""

    def __init__(self):
        import cupy

        self.pool = cupy.get_default_memory_pool()
        self.peak = self.pool.used_bytes()
        cupy.cuda.set_allocator(self.malloc)

    def malloc(self, size):
        memory = self.pool.malloc(size)
        used = self.pool.used_bytes()
        if used > self.peak:
            self.peak = used
        return memory

    def reset(self):
        self.peak = self.pool.used_bytes()


class PhasePeaks:
    """``with peaks.phase("save"): ...`` (or ``start("save")`` ... ``stop()``) records the phase's peak, the largest
    over repeated phases."""

    def __init__(self, device=None):
        self.device = device
        self.device_peak = DevicePeak() if device is not None and device.type == "cuda" else None
        self.rss = dict.fromkeys(PHASES, 0)
        self.device_bytes = dict.fromkeys(PHASES, 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)  # the longest occurrence of each phase
        self.per_phase = reset_peak_rss()
        self.current = None
        self.started = 0.0

    def start(self, name):
        reset_peak_rss()
        if self.device_peak is not None:
            self.device_peak.reset()
        self.current = name
        self.started = time.perf_counter()

    def stop(self):
        name, self.current = self.current, None
        self.rss[name] = max(self.rss[name], peak_rss_bytes())
        if self.device_peak is not None:
            self.device_bytes[name] = max(self.device_bytes[name], self.device_peak.peak)
        self.seconds[name] = max(self.seconds[name], time.perf_counter() - self.started)

    @contextlib.contextmanager
    def phase(self, name):
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def gather(self):
        """Every rank's figures, in MB: {"peak_rss_mb": {phase: [per rank]}, "device_mb": ...} (collective)."""
        mine = Tensor(np.array([self.rss[p] for p in PHASES] + [self.device_bytes[p] for p in PHASES], np.int64))
        parts = [Tensor(np.zeros(2 * len(PHASES), np.int64)) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, mine)
        rows = np.stack([p.numpy() for p in parts]) / 2 ** 20
        out = {"peak_rss_mb": {p: [round(float(v), 1) for v in rows[:, k]] for k, p in enumerate(PHASES)}}
        if rows[:, len(PHASES):].any():
            out["device_mb"] = {p: [round(float(v), 1) for v in rows[:, len(PHASES) + k]] for k, p in
                                enumerate(PHASES)}
        seconds = Tensor(np.array([self.seconds[p] for p in PHASES], np.float64))
        dist.all_reduce(seconds, dist.ReduceOp.MAX)
        out["seconds"] = {p: round(float(v), 4) for p, v in zip(PHASES, seconds.numpy())}  # the slowest rank's
        out["per_phase"] = self.per_phase
        return out

    def describe(self, gathered):
        """One line per rank: each phase's peak resident memory (phases that did not run are left out), and on GPUs
        each phase's peak device memory."""
        kind = "of each phase" if gathered["per_phase"] else "since start (the kernel refused per-phase resets)"
        text = f"peak resident memory {kind}:\n" + _per_rank(gathered["peak_rss_mb"])
        if "device_mb" in gathered:
            text += "\npeak GPU memory (in use) of each phase:\n" + _per_rank(gathered["device_mb"])
        return text


def _per_rank(by_phase):
    lines = []
    for rank in range(len(by_phase["build"])):
        parts = [f"{p.replace('_', ' ')} {by_phase[p][rank]:.0f}" for p in PHASES if by_phase[p][rank]]
        lines.append(f"  rank {rank}: " + ", ".join(parts) + " MB")
    return "\n".join(lines)


__all__ = ["DevicePeak", "PhasePeaks", "PHASES", "peak_rss_bytes", "reset_peak_rss"]
