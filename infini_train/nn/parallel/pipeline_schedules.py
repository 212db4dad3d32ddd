"""Pipeline schedules: for P stages, V model chunks per stage and M micro-batches, the order in which each stage
runs its actions on (chunk, micro-batch), and a global timetable that every rank derives alike. The actions: F (the
forward), B (the whole backward), and a backward split in two: I (the input gradients, what the previous chunk
needs) and W (the weight gradients, run later on the same stage where it would otherwise wait).

Placement (``chunk_stage``, ``stage_chunks``; a stage's local chunk v is the v-th of its model chunks): model chunk c
(of P x V) lives on stage c % P as its local chunk c // P, so with V = 1 stage s holds chunk s and with V > 1
(interleaved) chunks s, s + P, s + 2P, ... The V schedules (zbv, dualpipev; V = 2) lay the 2P chunks out in a V:
stage s holds chunks s and 2P - 1 - s, so the last stage runs the two middle chunks one after the other and stage 0
the first and the last (the loss). "Holds k" below counts the (chunk, micro-batch) activations a stage keeps at its
peak: an F adds one, the B (or the W of a split backward) frees it; under V = 2 each is half a stage's worth.

- ``gpipe``: every forward, then every backward; a stage holds the activations of all M micro-batches.
- ``1f1b`` (PipeDream-flush): stage s runs P - s - 1 warm-up forwards, then alternates one forward and one backward,
  then drains the backwards; it holds at most P - s micro-batches of activations.
- ``interleaved`` (Megatron-LM's interleaved 1F1B): 1F1B over the V chunks of each stage, visiting the chunks in
  groups of P micro-batches; the bubble shrinks by V for the same M. Needs M a multiple of P (M >= P).
- ``zb1p`` (ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; PyTorch's ScheduleInterleavedZeroBubble
  with V = 1): stage s runs min(P - s - 1, M) warm-up forwards, then F and I in turn, each I after the first s
  followed by the oldest deferred W; the cool-down runs I and W in turn, then the W's left. The s deferred W's keep
  s more micro-batches than 1F1B on stage s: every stage holds min(P, M), 1F1B's peak (that of its stage 0).
- ``zbv`` (ZB-V of the same paper; PyTorch's ScheduleZBVZeroBubble), with stage s's chunks s (first) and 2P - 1 - s
  (second): 2(P - s) - 1 forwards of the first; s pairs of forwards, second then first; P - s times F I W of the
  second; until both chunks ran every forward, F I W of the first (I W once its forwards are done) and F I W of the
  second; then s pairs of I's, first then second; P - s times I W of the first; the W's left of the second, then
  those of the first. Built for max(2P - 1, M) micro-batches with the actions of those >= M dropped, so it runs any
  M. Every stage holds 2P (P stage micro-batches, 1F1B's peak) when M >= 2P - 1.
- ``dualpipev`` (DeepSeek's DualPipeV, github.com/deepseek-ai/DualPipe; PyTorch's ScheduleDualPipeV), rank r with the
  same chunks: 2(P - r - 1) forwards of the first; r + 1 pairs of forwards, first then second; P - r - 1 times I of
  the second, the oldest pending W, F of the second; M - 2P + r + 1 times F (first), B (second), F (second), B
  (first) (DualPipe overlaps each F with the B after it, hiding one's communication behind the other's compute; here
  they run one after the other); P - r - 1 times B (second), F (second), B (first); r + 1 pairs of backwards, second
  then first, whole in the first half and split (I, its W queued) from pair (r + 1) // 2 on (on even ranks from that
  pair's second backward); P - r - 1 times the oldest pending W and I of the first; the r + 1 W's left, oldest first.
  Needs M >= 2P - 1 (DeepSeek's code asks 2P for its early receive; these orders run 2P - 1). Rank r holds 2P + 1
  when M >= 2P - r, else 2P.

``timetable`` simulates the schedules with unit-time actions: at tick t each stage runs its next action if the
action it depends on finished at an earlier tick: for F the previous chunk's forward of the same micro-batch; for B
or I the next chunk's B or I (on the last chunk its own forward: the loss); for W its I. Messages produced at tick t
are sent and received at tick t by both ranks, so every backend (including NCCL, whose transfers between a pair must
be issued in the same order on both sides) pairs them up; a dependency on the same stage needs no message.

Ideal bubble fraction (``ideal_bubble``): (P - 1) / (M + P - 1) for gpipe and 1f1b, (P - 1) / (V M + P - 1) for
interleaved; for the split schedules the mean over the stages of ``simulate`` with F = I = W = 1 and B = 2 per chunk
(free communication), which gives the formulas above for the other schedules too. It gives (P - 1) / (3M + P - 1)
for zb1p when M >= P (1F1B's idle time divided by 3; more when M < P), and (P - 1) / (6M + P - 1) for zbv and for
dualpipev when M >= 2P - 1: only the fill is left, one forward of half a stage per hop (B = I + W here, so the
overlapped pairs of DualPipeV gain nothing: they pay off by hiding communication, which is free in this model).
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb1p", "zbv", "dualpipev")
SPLIT_SCHEDULES = ("zb1p", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
COSTS = {"F": 1, "I": 1, "W": 1, "B": 2}


class ScheduleError(ValueError):
    """A schedule that cannot run with these sizes: names the numbers and a hint."""


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "I" or "W"
    chunk: int  # the model chunk (0 .. P*V - 1)
    mb: int  # the micro-batch

    def __repr__(self):
        return f"{self.kind}{self.chunk}.{self.mb}"


def chunk_stage(schedule, stages, virtual, chunk):
    """The stage that holds model chunk ``chunk``."""
    if schedule in V_SCHEDULES:
        return chunk if chunk < stages else 2 * stages - 1 - chunk
    return chunk % stages


def stage_chunks(schedule, stages, virtual, stage):
    """The model chunks of ``stage`` in local order (local chunk v is the v-th)."""
    if schedule in V_SCHEDULES:
        return [stage, 2 * stages - 1 - stage]
    return [local * stages + stage for local in range(virtual)]


def min_micro_batches(schedule, stages):
    """The fewest micro-batches per step ``schedule`` runs over P = ``stages`` (interleaved: also a multiple of P)."""
    return {"interleaved": stages, "dualpipev": 2 * stages - 1}.get(schedule, 1)


def check_schedule(schedule, stages, virtual, micro_batches):
    """Raise ScheduleError when ``schedule`` cannot run P = ``stages``, V = ``virtual``, M = ``micro_batches``
    (whether a model's layers split into P x V chunks is its ModelSpec's check)."""
    if schedule not in SCHEDULES:
        raise ScheduleError(f"parallel.pipeline_schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if schedule in V_SCHEDULES:
        if virtual != 2:
            raise ScheduleError(f"parallel.virtual_pipeline: {schedule} needs 2 model chunks per stage (laid out in a "
                                f"V), got {virtual}\nHINT: set parallel.virtual_pipeline=2")
        least = min_micro_batches(schedule, stages)
        if micro_batches < least:
            raise ScheduleError(
                f"parallel.pipeline_schedule: {schedule} needs at least 2 x parallel.pipeline ({stages}) - 1 = "
                f"{least} micro-batches per step (gradient-accumulation steps), got {micro_batches}\nHINT: set "
                f"train.total_batch_size so that total / (batch_size x sequence_length x data-parallel size) is at "
                f"least {least}, or use zbv")
        return
    if virtual > 1 and schedule != "interleaved":
        raise ScheduleError(f"parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule={schedule!r}, got "
                            f"{virtual}\nHINT: set parallel.pipeline_schedule=interleaved to run {virtual} model "
                            "chunks per stage" + (" (or zbv / dualpipev: a V)" if virtual == 2 else ""))
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
    if schedule in SPLIT_SCHEDULES:
        check_schedule(schedule, P, V, M)
    if schedule == "zb1p":
        return _zb1p_order(P, M, s)
    if schedule == "zbv":
        return _zbv_order(P, M, s)
    if schedule == "dualpipev":
        return _dualpipev_order(P, M, s)
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


class _Order(list):
    """One stage's actions as a schedule appends them: ``add(kind, chunk)`` takes the chunk's next micro-batch for
    that kind (B and I count alike, being the backward); ``w(chunk)`` the W of the oldest I not yet followed by its W
    (of ``chunk``, or of any chunk; nothing when none waits). Actions of micro-batches >= ``limit`` are dropped."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit
        self.counts = {}
        self.pending = []

    def count(self, kind, chunk):
        return self.counts.get(("F" if kind == "F" else "B", chunk), 0)

    def add(self, kind, chunk):
        mb = self.count(kind, chunk)
        self.counts[("F" if kind == "F" else "B", chunk)] = mb + 1
        if kind == "I":
            self.pending.append(Action("W", chunk, mb))
        self._put(Action(kind, chunk, mb))

    def w(self, chunk=None):
        waiting = [i for i, a in enumerate(self.pending) if chunk is None or a.chunk == chunk]
        if waiting:
            self._put(self.pending.pop(waiting[0]))

    def _put(self, action):
        if action.mb < self.limit:
            self.append(action)


def _zb1p_order(P, M, s):
    warmup = min(P - s - 1, M)
    order = [Action("F", s, m) for m in range(warmup)]
    for i in range(M):
        if warmup + i < M:
            order.append(Action("F", s, warmup + i))
        order.append(Action("I", s, i))
        if i >= s:
            order.append(Action("W", s, i - s))
    return order + [Action("W", s, m) for m in range(max(M - s, 0), M)]


def _zbv_order(P, M, s):
    n = max(2 * P - 1, M)
    first, second = s, 2 * P - 1 - s
    order = _Order(M)
    for _ in range(2 * (P - s) - 1):
        order.add("F", first)
    for _ in range(s):
        order.add("F", second)
        order.add("F", first)
    for _ in range(P - s):
        order.add("F", second)
        order.add("I", second)
        order.w(second)
    while order.count("F", second) < order.count("F", first) or order.count("F", first) < n:
        if order.count("F", first) < n:
            order.add("F", first)
        order.add("I", first)
        order.w(first)
        order.add("F", second)
        order.add("I", second)
        order.w(second)
    for _ in range(s):
        order.add("I", first)
        order.add("I", second)
    for _ in range(P - s):
        order.add("I", first)
        order.w(first)
    while any(a.chunk == second for a in order.pending):
        order.w(second)
    while order.pending:
        order.w(first)
    return list(order)


def _dualpipev_order(P, M, r):
    first, second = r, 2 * P - 1 - r
    order = _Order(M)
    for _ in range(2 * (P - r - 1)):
        order.add("F", first)
    for _ in range(r + 1):
        order.add("F", first)
        order.add("F", second)
    for _ in range(P - r - 1):
        order.add("I", second)
        order.w()
        order.add("F", second)
    for _ in range(M - 2 * P + r + 1):
        for forward, backward in ((first, second), (second, first)):
            order.add("F", forward)
            order.add("B", backward)
    for _ in range(P - r - 1):
        order.add("B", second)
        order.add("F", second)
        order.add("B", first)
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        order.add("I" if split else "B", second)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        order.add("I" if split else "B", first)
    for _ in range(P - r - 1):
        order.w()
        order.add("I", first)
    for _ in range(r + 1):
        order.w()
    return list(order)


def forward_only_order(stages, virtual, micro_batches, stage, schedule="1f1b"):
    """Forwards only (evaluation): every micro-batch of the stage's chunks, chunk by chunk in model order."""
    chunks = sorted(stage_chunks(schedule, stages, virtual, stage))
    return [Action("F", chunk, m) for chunk in chunks for m in range(micro_batches)]


def _dependency(action, chunks):
    """The actions whose result ``action`` waits for, as (kind, chunk, mb) keys any one of which will do."""
    c, m = action.chunk, action.mb
    if action.kind == "F":
        return (("F", c - 1, m),) if c > 0 else ()
    if action.kind == "W":
        return (("I", c, m),)
    if c == chunks - 1:
        return (("F", c, m),)  # the loss, computed on this stage
    return (("B", c + 1, m), ("I", c + 1, m))


def _run(orders, stages, virtual, schedule, costs):
    """The start time of each stage's actions when each starts as soon as its stage is free and what it depends on
    has finished (``costs``: the duration of each kind). Raises ScheduleError on an action of a chunk the stage
    does not hold, and when the orders deadlock."""
    for s, order in enumerate(orders):
        stray = [a for a in order if chunk_stage(schedule, stages, virtual, a.chunk) != s]
        if stray:
            raise ScheduleError(f"pipeline schedule {schedule}: stage {s} runs {stray[:3]} of chunks it does not hold "
                                f"({stage_chunks(schedule, stages, virtual, s)})")
    chunks = stages * virtual
    end = {}
    free = [0] * stages
    starts = [[] for _ in range(stages)]
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while len(starts[s]) < len(orders[s]):
                action = orders[s][len(starts[s])]
                need = _dependency(action, chunks)
                ready = [end[k] for k in need if k in end]
                if need and not ready:
                    break
                start = max(free[s], min(ready)) if ready else free[s]
                starts[s].append(start)
                free[s] = end[(action.kind, action.chunk, action.mb)] = start + costs[action.kind]
                moved = True
    waiting = {s: orders[s][len(starts[s])] for s in range(stages) if len(starts[s]) < len(orders[s])}
    if waiting:
        raise ScheduleError(f"pipeline schedule deadlocks at tick {max(free):g}: stages wait on {waiting}")
    return starts


def timetable(orders, stages, virtual, schedule="1f1b"):
    """Ticks: ``table[t][s]`` is the action stage s runs at tick t (or None). Raises ScheduleError when the
    orders deadlock (no stage can move)."""
    starts = _run(orders, stages, virtual, schedule, dict.fromkeys("FBIW", 1))
    table = [[None] * stages for _ in range(max((t[-1] + 1 for t in starts if t), default=0))]
    for s, order in enumerate(orders):
        for action, tick in zip(order, starts[s]):
            table[tick][s] = action
    return table


def start_times(orders, stages, virtual, schedule, costs=None):
    """When each stage starts each action of its order (``starts[s][k]``) when actions take ``costs`` (default
    ``COSTS``: F = I = W = 1, B = 2) and communication is free."""
    return _run(orders, stages, virtual, schedule, {**COSTS, **(costs or {})})


def simulate(orders, stages, virtual, schedule, costs=None):
    """Each stage's idle fraction (idle / makespan) when actions take ``costs`` (default ``COSTS``: F = I = W = 1,
    B = 2) and communication is free: every stage starts at 0, the makespan ends with the last action of any stage."""
    costs = {**COSTS, **(costs or {})}
    starts = start_times(orders, stages, virtual, schedule, costs)
    busy = [sum(costs[a.kind] for a in order) for order in orders]
    makespan = max((t[-1] + costs[o[-1].kind] for t, o in zip(starts, orders) if o), default=0)
    return [1 - b / makespan if makespan else 0.0 for b in busy]


def ideal_bubble(schedule, stages, virtual, micro_batches):
    """The idle fraction of a stage with equal forward / backward times: (P-1)/(M+P-1), or /V interleaved; the mean
    over the stages of ``simulate`` for the split schedules."""
    P, V, M = stages, virtual, micro_batches
    if schedule in SPLIT_SCHEDULES:
        bubbles = simulate([stage_order(schedule, P, V, M, s) for s in range(P)], P, V, schedule)
        return sum(bubbles) / P
    return (P - 1) / (V * M + P - 1) if schedule == "interleaved" else (P - 1) / (M + P - 1)


__all__ = ["SCHEDULES", "SPLIT_SCHEDULES", "V_SCHEDULES", "COSTS", "ScheduleError", "Action", "chunk_stage",
           "stage_chunks", "min_micro_batches", "check_schedule", "stage_order", "forward_only_order", "timetable",
           "start_times", "simulate", "ideal_bubble"]
