"""Device time of ops on GPUs: a pair of CUDA events recorded on the current stream around each op, resolved
once when the profile stops (one synchronize per device, no stall while profiling).

Each device gets an anchor event recorded right after a synchronize, with the host time taken once it has
completed; a GPU interval then sits on the host clock at ``anchor_host_ns + elapsed(anchor, start)``, which is
how the trace draws a GPU track beside the host threads."""
from __future__ import annotations

import time

from .. import backend


def cuda_profiling_available():
    """True when cupy imports and sees at least one GPU."""
    return backend.cuda_available()


class CudaTimer:
    def __init__(self):
        self.cupy = backend.cupy_module()
        self.anchors = {}  # device index -> (anchor event, host ns when it completed)

    def _anchor(self, index):
        cuda = self.cupy.cuda
        with cuda.Device(index):
            cuda.Device(index).synchronize()
            event = cuda.Event()
            event.record()
            event.synchronize()
            self.anchors[index] = (event, time.perf_counter_ns())

    def record(self, index):
        """A CUDA event recorded now on ``index``'s current stream."""
        if index not in self.anchors:
            self._anchor(index)
        with self.cupy.cuda.Device(index):
            event = self.cupy.cuda.Event()
            event.record()
        return event

    def resolve(self, events):
        """Fill ``device_start_ns`` / ``device_ns`` of every event that holds a (start, end) pair, and each parent's
        ``children_device_ns``; one synchronize per device used."""
        cuda = self.cupy.cuda
        for index in self.anchors:
            cuda.Device(index).synchronize()
        for event in events:
            if event.cuda_events is None:
                continue
            (index, start, end) = event.cuda_events
            anchor, anchor_ns = self.anchors[index]
            event.device_start_ns = anchor_ns + int(cuda.get_elapsed_time(anchor, start) * 1e6)
            event.device_ns = int(cuda.get_elapsed_time(start, end) * 1e6)
            event.cuda_events = None
        for event in events:
            if event.device_ns and event.cpu_parent is not None:
                event.cpu_parent.children_device_ns += event.device_ns


__all__ = ["CudaTimer", "cuda_profiling_available"]
