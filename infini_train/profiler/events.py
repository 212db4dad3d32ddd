"""Profiled events and their aggregates, with torch.autograd.profiler's names and units (microseconds).

``FunctionEvent``: one recorded interval (an op's forward or backward, a named range) on one thread, with its
place in that thread's nesting (``cpu_parent``) and, on a GPU, its device time. ``FunctionEventAvg``: the events
of one name (and input shapes, when grouped) summed. ``EventList``: a list of either, with ``key_averages()`` and
``table()``.
"""
from __future__ import annotations

from .table import build_table, format_time

# kinds of events: op forwards and backwards, and the ranges of observers.record / record_function
FORWARD, BACKWARD = "forward", "backward"


class FunctionEvent:
    """One interval on one thread. Host times are integer nanoseconds (``start_ns``/``end_ns`` on the profiler's
    clock); the torch-style properties give microseconds."""

    __slots__ = ("id", "name", "kind", "thread", "start_ns", "end_ns", "children_ns", "input_shapes", "sequence_nr",
                 "cpu_parent", "device", "cuda_events", "device_start_ns", "device_ns", "children_device_ns")

    def __init__(self, id, name, kind, thread, cpu_parent, input_shapes=None, sequence_nr=-1, device=None):
        self.id = id
        self.name = name
        self.kind = kind
        self.thread = thread
        self.cpu_parent = cpu_parent
        self.input_shapes = input_shapes
        self.sequence_nr = sequence_nr
        self.device = device  # "cuda:0" when the op ran on a GPU, else None
        self.start_ns = self.end_ns = 0
        self.children_ns = 0  # host time of the events directly nested in this one
        self.cuda_events = None  # (start, end) cupy events until resolved
        self.device_start_ns = None  # the GPU interval, on the host clock, once resolved
        self.device_ns = 0
        self.children_device_ns = 0

    @property
    def key(self):
        return self.name

    @property
    def count(self):
        return 1

    @property
    def cpu_time_total(self):
        return (self.end_ns - self.start_ns) / 1000

    @property
    def self_cpu_time_total(self):
        return (self.end_ns - self.start_ns - self.children_ns) / 1000

    cpu_time = cpu_time_total

    @property
    def device_time_total(self):
        return self.device_ns / 1000

    @property
    def self_device_time_total(self):
        return max(self.device_ns - self.children_device_ns, 0) / 1000

    device_time = device_time_total
    cuda_time_total = device_time_total
    self_cuda_time_total = self_device_time_total

    def __repr__(self):
        return (f"<FunctionEvent id={self.id} name={self.name} kind={self.kind} thread={self.thread} "
                f"cpu_time_total={format_time(self.cpu_time_total)} "
                f"self_cpu_time_total={format_time(self.self_cpu_time_total)}>")


class FunctionEventAvg:
    """The events sharing one key: ``count`` calls and their summed times (microseconds)."""

    def __init__(self, key, input_shapes=None):
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        self.cpu_time_total = self.self_cpu_time_total = 0.0
        self.device_time_total = self.self_device_time_total = 0.0

    def add(self, event):
        self.count += event.count
        self.cpu_time_total += event.cpu_time_total
        self.self_cpu_time_total += event.self_cpu_time_total
        self.device_time_total += event.device_time_total
        self.self_device_time_total += event.self_device_time_total
        return self

    @property
    def cpu_time(self):
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self):
        return self.device_time_total / self.count if self.count else 0.0

    cuda_time_total = property(lambda self: self.device_time_total)
    self_cuda_time_total = property(lambda self: self.self_device_time_total)
    cuda_time = device_time

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"self_cpu_time_total={format_time(self.self_cpu_time_total)} "
                f"cpu_time_total={format_time(self.cpu_time_total)}>")


class EventList(list):
    """A list of FunctionEvent (``prof.events()``) or FunctionEventAvg (``prof.key_averages()``)."""

    def __init__(self, events=(), use_device=None):
        super().__init__(events)
        self.use_device = use_device  # "cuda" when device times were recorded

    def key_averages(self, group_by_input_shape=False):
        """One FunctionEventAvg per event name (and per input shapes with ``group_by_input_shape``), in order of
        first appearance."""
        groups = {}
        for event in self:
            shapes = str(event.input_shapes) if group_by_input_shape else None
            key = (event.key, shapes)
            avg = groups.get(key)
            if avg is None:
                avg = groups[key] = FunctionEventAvg(event.key, event.input_shapes if group_by_input_shape else None)
            avg.add(event)
        return EventList(groups.values(), self.use_device)

    @property
    def self_cpu_time_total(self):
        """Summed self time of every event (microseconds): the host time the profile covers on all threads."""
        return sum(event.self_cpu_time_total for event in self)

    def table(self, sort_by=None, row_limit=100, max_name_column_width=55, max_shapes_column_width=80, header=None):
        """torch's profiler table: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg, the CUDA
        columns when device time was recorded, # of Calls, and Input Shapes when grouped by them; rows sorted
        by ``sort_by`` (an attribute such as "self_cpu_time_total", "cpu_time_total", "cuda_time_total",
        "count"), at most ``row_limit`` of them (-1: all), then the "Self CPU time total" footer."""
        return build_table(self, sort_by=sort_by, row_limit=row_limit, header=header, use_device=self.use_device,
                           max_name_column_width=max_name_column_width,
                           max_shapes_column_width=max_shapes_column_width)

    def __str__(self):
        return self.table()


__all__ = ["FunctionEvent", "FunctionEventAvg", "EventList", "FORWARD", "BACKWARD"]
