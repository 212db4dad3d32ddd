"""Pipeline schedules: for P stages, V model chunks per stage and M micro-batches, the order in which each stage
runs its forwards F(chunk, mb) and backwards B(chunk, mb), and a global timetable that every rank derives alike.

Model chunk c (of P x V) lives on stage c % P as its local chunk c // P: with V = 1 stage s holds chunk s; with V > 1
(interleaved) stage s holds chunks s, s + P, s + 2P, ...

- ``gpipe``: every forward, then every backward; a stage holds the activations of all M micro-batches.
- ``1f1b`` (PipeDream-flush): stage s runs P - s - 1 warm-up forwards, then alternates one forward and one backward,
  then drains the backwards; it holds at most P - s micro-batches of activations.
- ``interleaved`` (Megatron-LM's interleaved 1F1B): 1F1B over the V chunks of each stage, visiting the chunks in
  groups of P micro-batches; the bubble shrinks by V for the same M. Needs M a multiple of P (M >= P).

``timetable`` simulates the schedules with unit-time actions: at tick t each stage runs its next action if the
action it depends on (the previous chunk's forward of the same micro-batch, or the next chunk's backward) finished
at an earlier tick. Messages produced at tick t are sent and received at tick t by both ranks, so every backend
(including NCCL, whose transfers between a pair must be issued in the same order on both sides) pairs them up.
Ideal bubble fraction: (P - 1) / (M + P - 1) for gpipe and 1f1b, (P - 1) / (V M + P - 1) for interleaved.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class ScheduleError(ValueError):
    """A schedule that cannot run with these sizes: names the numbers and a hint."""


@dataclass(frozen=True)
class Action:
    kind: str  # "F" or "B"
    chunk: int  # the model chunk (0 .. P*V - 1)
    mb: int  # the micro-batch

    def __repr__(self):
        return f"{self.kind}{self.chunk}.{self.mb}"


def check_schedule(schedule, stages, virtual, micro_batches):
    """Raise ScheduleError when ``schedule`` cannot run P = ``stages``, V = ``virtual``, M = ``micro_batches``
    (whether a model's layers split into P x V chunks is its ModelSpec's check)."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"parallel.pipeline_schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if virtual > 1 and schedule != "interleaved":
        raise ScheduleError(f"parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule={schedule!r}, got "
                            f"{virtual}\nHINT: set parallel.pipeline_schedule=interleaved to run {virtual} model "
                            "chunks per stage")
    if schedule == "interleaved":
        if virtual < 2:
            raise ScheduleError(f"parallel.pipeline_schedule: interleaved needs parallel.virtual_pipeline >= 2 (model "
                                f"chunks per stage), got {virtual}\nHINT: set parallel.virtual_pipeline=2, or use 1f1b")
        if micro_batches < stages or micro_batches % stages:
            raise ScheduleError(
                f"parallel.pipeline_schedule: interleaved needs the micro-batches per step (gradient-accumulation "
                f"steps, {micro_batches}) to be a multiple of parallel.pipeline ({stages})\nHINT: set "
                f"train.total_batch_size so that total / (batch_size x sequence_length x data-parallel size) is "
                f"{max(stages, -(-micro_batches // stages) * stages)}, or use 1f1b")


def stage_order(schedule, stages, virtual, micro_batches, stage):
    """The actions of ``stage`` in the order it runs them."""
    P, V, M, s = stages, virtual, micro_batches, stage
    if schedule == "gpipe":
        return [Action("F", s, m) for m in range(M)] + [Action("B", s, m) for m in range(M)]
    if schedule == "1f1b":
        warmup = min(P - s - 1, M)
        order = [Action("F", s, m) for m in range(warmup)]
        for i in range(M - warmup):
            order += [Action("F", s, warmup + i), Action("B", s, i)]
        return order + [Action("B", s, m) for m in range(M - warmup, M)]
    return _interleaved_order(P, V, M, s)


def _interleaved_order(P, V, M, s):
    total = M * V

    def forward(k):  # the k-th forward of this stage: micro-batches in groups of P, chunk by chunk
        local = (k // P) % V
        return Action("F", local * P + s, (k // (P * V)) * P + k % P)

    def backward(k):
        local = V - 1 - (k // P) % V
        return Action("B", local * P + s, (k // (P * V)) * P + k % P)

    warmup = total if M == P else min(total, (P - s - 1) * 2 + (V - 1) * P)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def forward_only_order(stages, virtual, micro_batches, stage):
    """Forwards only (evaluation): every local chunk's micro-batches in chunk-major order."""
    return [Action("F", local * stages + stage, m) for local in range(virtual) for m in range(micro_batches)]


def _dependency(action, chunks):
    """The action whose result ``action`` waits for: (kind, chunk, mb), or None."""
    if action.kind == "F":
        return ("F", action.chunk - 1, action.mb) if action.chunk > 0 else None
    if action.chunk == chunks - 1:
        return ("F", action.chunk, action.mb)  # the loss, computed on this stage
    return ("B", action.chunk + 1, action.mb)


def timetable(orders, stages, virtual):
    """Ticks: ``table[t][s]`` is the action stage s runs at tick t (or None). Raises ScheduleError when the
    orders deadlock (no stage can move)."""
    chunks = stages * virtual
    done = {}  # (kind, chunk, mb) -> tick it finished
    position = [0] * stages
    table = []
    while any(position[s] < len(orders[s]) for s in range(stages)):
        tick = len(table)
        row = [None] * stages
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            action = orders[s][position[s]]
            need = _dependency(action, chunks)
            if need is None or done.get(need, tick) < tick:
                row[s] = action
        if not any(row):
            waiting = {s: orders[s][position[s]] for s in range(stages) if position[s] < len(orders[s])}
            raise ScheduleError(f"pipeline schedule deadlocks at tick {tick}: stages wait on {waiting}")
        for s, action in enumerate(row):
            if action is not None:
                done[(action.kind, action.chunk, action.mb)] = tick
                position[s] += 1
        table.append(row)
    return table


def ideal_bubble(schedule, stages, virtual, micro_batches):
    """The idle fraction of a stage with equal forward / backward times: (P-1)/(M+P-1), or /V interleaved."""
    P, V, M = stages, virtual, micro_batches
    return (P - 1) / (V * M + P - 1) if schedule == "interleaved" else (P - 1) / (M + P - 1)


__all__ = ["SCHEDULES", "ScheduleError", "Action", "check_schedule", "stage_order", "forward_only_order",
           "timetable", "ideal_bubble"]
