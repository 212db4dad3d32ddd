"""``profile``: torch.profiler's context manager over infini_train's op observers.

    with it.profiler.profile(record_shapes=True) as prof:
        with it.profiler.record_function("train_step"):
            loss = model(x, y)[1]; loss.backward(); opt.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    prof.export_chrome_trace("trace.json")

Every Function's forward is an event named after the op (``Matmul``), its backward ``MatmulBackward`` (a leaf's
gradient accumulation is ``AccumulateGrad``); both carry the same sequence number. Named ranges
(``record_function``, collectives such as ``mpi:all_reduce``, ``Optimizer.step#AdamW.step``) are events too.
Events nest per thread: an event's self time is its time minus that of the events directly inside it.
"""
from __future__ import annotations

import enum
import itertools
import threading
import time

from ..autograd import observers
from ..backend import is_array_like
from .chrome_trace import write_chrome_trace
from .cuda_timing import CudaTimer, cuda_profiling_available
from .events import BACKWARD, FORWARD, EventList, FunctionEvent

_perf_ns = time.perf_counter_ns
_native_id = threading.get_native_id


class ProfilerActivity(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


def _shapes(values):
    return [list(v.shape) if is_array_like(v) else [] for v in values]


def _cuda_index(fn, inputs):
    """The GPU index an op runs on, or None: ``fn.device`` once set, else the first input that has a device."""
    device = fn.device
    if device is None:
        for x in inputs:
            device = getattr(x, "device", None)
            if device is not None:
                break
    return device.index if getattr(device, "type", None) == "cuda" else None


class _ThreadEvents(threading.local):
    stack = None  # per thread: the events open now, innermost last (a list from the thread's first event on)


class _Recorder(observers.OpObserver):
    """The observer: one event per forward, backward and range, nested per thread."""

    def __init__(self, record_shapes, cuda_timer):
        self.record_shapes = record_shapes
        self.cuda = cuda_timer
        self.events = []  # finished events (list.append is atomic: replicas' threads append concurrently)
        self.threads = {}  # native thread id -> thread name
        self._local = _ThreadEvents()
        self._ids = itertools.count()
        self._sequence_nrs = itertools.count()
        self._sequence = {}  # id(fn) -> sequence number of its forward (an object's id is unique while it lives)

    def _stack(self):
        stack = self._local.stack
        if stack is None:
            stack = self._local.stack = []
            self.threads[_native_id()] = threading.current_thread().name
        return stack

    def _begin(self, name, kind, shapes=None, sequence_nr=-1, cuda_index=None):
        stack = self._stack()
        event = FunctionEvent(next(self._ids), name, kind, _native_id(), stack[-1] if stack else None, shapes,
                              sequence_nr, None if cuda_index is None else f"cuda:{cuda_index}")
        stack.append(event)
        if cuda_index is not None:
            event.cuda_events = (cuda_index, self.cuda.record(cuda_index))
        event.start_ns = _perf_ns()
        return event

    def _end(self, event):
        end = _perf_ns()
        if event is None:
            return
        event.end_ns = end
        if event.cuda_events is not None:
            index, start = event.cuda_events
            event.cuda_events = (index, start, self.cuda.record(index))
        stack = self._stack()
        while stack and stack.pop() is not event:  # drops the events of ops that raised (they never ended)
            pass
        if event.cpu_parent is not None:
            event.cpu_parent.children_ns += end - event.start_ns
        self.events.append(event)

    # ---------------------------------------------------------------------------------------- observer
    def forward_begin(self, fn, inputs):
        sequence_nr = next(self._sequence_nrs)
        self._sequence[id(fn)] = sequence_nr
        cuda_index = _cuda_index(fn, inputs) if self.cuda is not None else None
        return self._begin(fn.name, FORWARD, _shapes(inputs) if self.record_shapes else None, sequence_nr,
                           cuda_index)

    def forward_end(self, token, fn, inputs, outputs):
        self._end(token)

    def backward_begin(self, fn, grad_outputs):
        name = fn.name
        if name != "AccumulateGrad":
            name += "Backward"
        cuda_index = _cuda_index(fn, ()) if self.cuda is not None else None
        return self._begin(name, BACKWARD, _shapes(grad_outputs) if self.record_shapes else None,
                           self._sequence.get(id(fn), -1), cuda_index)

    def backward_end(self, token, fn, grad_inputs):
        self._end(token)

    def range_begin(self, name, kind):
        return self._begin(name, kind, [] if self.record_shapes else None)

    def range_end(self, token):
        self._end(token)


class profile:
    """Record every op's forward and backward, collectives, optimizer steps and ``record_function`` ranges
    between ``start()`` and ``stop()`` (or inside ``with``).

    ``activities``: ProfilerActivity.CPU and/or .CUDA (default: CPU, plus CUDA when a GPU is present); with CUDA
    an op on a GPU also gets its device time from CUDA events. ``record_shapes``: keep each event's input shapes
    (``key_averages(group_by_input_shape=True)``)."""

    def __init__(self, activities=None, record_shapes=False):
        if activities is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda_profiling_available() else [])
        activities = set(activities)
        for a in activities:
            if not isinstance(a, ProfilerActivity):
                raise ValueError(f"profile: expected activities from it.profiler.ProfilerActivity (CPU, CUDA), got "
                                 f"{a!r}\nHINT: profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])")
        if ProfilerActivity.CUDA in activities and not cuda_profiling_available():
            raise RuntimeError("profile: ProfilerActivity.CUDA needs cupy and a GPU, and none was found\n"
                               "HINT: leave activities=None to profile what this machine has")
        self.activities = activities
        self.record_shapes = bool(record_shapes)
        self.use_device = "cuda" if ProfilerActivity.CUDA in activities else None
        self._recorder = None
        self._events = None
        self.start_ns = self.stop_ns = None  # perf_counter_ns at start / stop
        self.wall_anchor_ns = None  # (time.time_ns(), perf_counter_ns()) taken together at start

    # ----------------------------------------------------------------------------------------- lifecycle
    def start(self):
        if self._recorder is not None:
            raise RuntimeError("profile.start: this profiler is already running\nHINT: call stop() first")
        cuda = CudaTimer() if self.use_device else None
        self._recorder = _Recorder(self.record_shapes, cuda)
        self._events = None
        self.wall_anchor_ns = (time.time_ns(), _perf_ns())
        self.start_ns = _perf_ns()
        observers.install(self._recorder)
        return self

    def stop(self):
        recorder = self._recorder
        if recorder is None:
            raise RuntimeError("profile.stop: the profiler is not running\nHINT: call start() first")
        observers.uninstall(recorder)
        self.stop_ns = _perf_ns()
        if recorder.cuda is not None:
            recorder.cuda.resolve(recorder.events)
        self._events = EventList(sorted(recorder.events, key=lambda e: (e.start_ns, -e.end_ns)), self.use_device)
        self._threads = dict(recorder.threads)
        self._recorder = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # ---------------------------------------------------------------------------------------- results
    def _finished(self, what):
        if self._events is None:
            raise RuntimeError(f"profile.{what}: no finished profile (the profiler is running or never ran)\n"
                               "HINT: read results after the with-block (or after stop())")
        return self._events

    def events(self):
        """Every recorded FunctionEvent, ordered by start time (an enclosing event before what it holds)."""
        return self._finished("events")

    def key_averages(self, group_by_input_shape=False):
        """The events summed per name (per name and input shapes with ``group_by_input_shape``)."""
        return self._finished("key_averages").key_averages(group_by_input_shape)

    @property
    def wall_time_us(self):
        """Microseconds between start() and stop()."""
        self._finished("wall_time_us")
        return (self.stop_ns - self.start_ns) / 1000

    @property
    def thread_names(self):
        """{native thread id: thread name} of the threads that recorded events."""
        self._finished("thread_names")
        return self._threads

    def export_chrome_trace(self, path, pid=None):
        """Write the events as Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one track per thread, one
        for each GPU's device time; ``pid`` defaults to this process's rank (0 without a process group)."""
        if pid is None:
            from .. import distributed as dist
            pid = dist.get_rank() if dist.is_initialized() else 0
        return write_chrome_trace(path, self._finished("export_chrome_trace"), self._threads, pid,
                                  self.wall_anchor_ns)


class record_function:
    """A named range in the profile (``with record_function("name"):`` or ``@record_function("name")``), built on
    ``observers.record``: nothing is recorded, and almost nothing done, when no profiler runs."""

    def __init__(self, name):
        self.name = name
        self._range = None

    def __enter__(self):
        self._range = observers.record(self.name, "user")
        self._range.__enter__()
        return self

    def __exit__(self, *exc):
        entered, self._range = self._range, None
        return entered.__exit__(*exc)

    def __call__(self, fn):
        import functools

        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with observers.record(name, "user"):
                return fn(*args, **kwargs)
        return wrapper


__all__ = ["profile", "record_function", "ProfilerActivity"]
