"""Chrome trace JSON (the Trace Event Format read by ui.perfetto.dev and chrome://tracing), as torch writes it.

A trace holds complete events (``"ph": "X"``, microsecond ``ts`` and ``dur``) and metadata events naming
processes and threads. The process is the rank (``pid`` = rank), each host thread is a track (``tid`` = its
native id: DataParallel replicas get one each) and each GPU's device time one more. Times are microseconds
since ``baseTimeNanoseconds`` (Unix time of the profile's start), so the traces of several ranks line up when
merged (``merge_chrome_traces``) on machines with synchronised clocks.
"""
from __future__ import annotations

import json
import os

from ..atomic_file import write_text_atomically
from .events import BACKWARD, FORWARD

GPU_TRACK = 1 << 30  # tid of GPU i's device-time track: GPU_TRACK + i (above any host thread id)
_CATEGORY = {FORWARD: "cpu_op", BACKWARD: "cpu_op", "user": "user_annotation"}


def _us(ns):
    return round(ns / 1000, 3)


def trace_dict(events, threads, pid, wall_anchor_ns):
    """The trace of ``events`` (FunctionEvents) as a dict: ``threads`` maps native thread ids to names,
    ``wall_anchor_ns`` = (Unix ns, perf_counter ns) taken together when the profile started."""
    wall0, perf0 = wall_anchor_ns
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for order, (tid, name) in enumerate(sorted(threads.items())):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": order}})
    gpus = set()
    for e in events:
        args = {"kind": e.kind}
        if e.sequence_nr >= 0:
            args["Sequence number"] = e.sequence_nr
        if e.input_shapes is not None:
            args["Input Dims"] = e.input_shapes
        if e.device is not None:
            args["device"] = e.device
        out.append({"ph": "X", "cat": _CATEGORY.get(e.kind, e.kind), "name": e.name, "pid": pid, "tid": e.thread,
                    "ts": _us(e.start_ns - perf0), "dur": _us(e.end_ns - e.start_ns), "args": args})
        if e.device_start_ns is not None:
            index = int(e.device.partition(":")[2])
            gpus.add(index)
            out.append({"ph": "X", "cat": "gpu_op", "name": e.name, "pid": pid, "tid": GPU_TRACK + index,
                        "ts": _us(e.device_start_ns - perf0), "dur": _us(e.device_ns),
                        "args": {"kind": e.kind, "device": e.device, "Sequence number": e.sequence_nr}})
    for index in sorted(gpus):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": GPU_TRACK + index,
                    "args": {"name": f"cuda:{index} (device time)"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": GPU_TRACK + index,
                    "args": {"sort_index": GPU_TRACK + index}})
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": wall0, "traceEvents": out}


def write_json_atomic(path, data):
    """Write ``data`` as JSON to ``path`` through a temporary file and os.replace (never a half-written file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return write_text_atomically(path, json.dumps(data, separators=(",", ":")))


def write_chrome_trace(path, events, threads, pid, wall_anchor_ns):
    return write_json_atomic(path, trace_dict(events, threads, pid, wall_anchor_ns))


def merge_traces(traces, ranks=None):
    """One trace of several (dicts as ``trace_dict`` makes them): trace i becomes process ``ranks[i]`` (default:
    the pid it already has), its times moved onto the earliest trace's base."""
    if not traces:
        raise ValueError("merge_chrome_traces: expected at least one trace, got none")
    if ranks is not None and len(ranks) != len(traces):
        raise ValueError(f"merge_chrome_traces: expected one rank per trace ({len(traces)}), got {len(ranks)} ranks")
    base = min(t.get("baseTimeNanoseconds", 0) for t in traces)
    merged = []
    for i, trace in enumerate(traces):
        events = trace["traceEvents"]
        if ranks is not None:
            pid = ranks[i]
        else:
            pid = next((e["pid"] for e in events if "pid" in e), i)
        shift = (trace.get("baseTimeNanoseconds", 0) - base) / 1000
        for e in events:
            e = dict(e, pid=pid)
            if e.get("name") in ("process_name", "process_sort_index") and e.get("ph") == "M":
                e["args"] = {"name": f"rank {pid}"} if e["name"] == "process_name" else {"sort_index": pid}
            if "ts" in e:
                e["ts"] = round(e["ts"] + shift, 3)
            merged.append(e)
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base, "traceEvents": merged}


def merge_chrome_traces(paths, out_path, ranks=None):
    """Merge per-rank trace files into ``out_path``: each rank its own process (pid = rank; default: the pid in
    its file), so Perfetto shows one track group per rank with its threads inside. Returns ``out_path``."""
    traces = []
    for path in paths:
        with open(path) as f:
            traces.append(json.load(f))
    return write_json_atomic(out_path, merge_traces(traces, ranks))


__all__ = ["trace_dict", "write_chrome_trace", "merge_traces", "merge_chrome_traces", "write_json_atomic"]
