"""Pipeline parallelism: this rank runs stage ``group.rank`` of a pipeline over ``group`` (its model chunks), passing
activations forward and gradients back to the neighbouring stages with point-to-point transfers.

``PipelineParallel(chunks, group, schedule, virtual)``: ``chunks`` are this stage's model chunks in local order
(``stage_chunks`` in pipeline_schedules.py says which: model chunk v * P + stage for local chunk v, or in a V (zbv,
dualpipev) the stage's chunk on the way down and the one on the way back up). A chunk is called as
``chunk(x, targets)``: the first model chunk gets the micro-batch's inputs, the others the previous chunk's
activation; the last returns ``(output, loss)``, the others their activation. ``parts`` says what an activation is:
a list of (shape, dtype), one Tensor per part -- one part is a Tensor, several a tuple of Tensors (a
mixture-of-experts model also passes its router statistics on), each sent as its own message and each getting its
gradient back.

``train_step`` runs the forwards and backwards of every micro-batch in the schedule's order (``timetable``): at each
tick this stage runs its action, then sends what it produced and posts the receives of what its neighbours produced
at that tick, all in one ``batch_isend_irecv``; a receive is waited on only when its action runs (the next chunk on
the same stage, in a V, takes a copy without a transfer). An activation is kept until its backward ran (its weight
half, where the schedule splits backwards into I and W), then freed with its graph. Gradients accumulate in the
parameters; the caller syncs them (data parallel, tied weights) and steps.

``forward`` runs one input through the chunks in order (no overlap: evaluation and generation).
"""
from __future__ import annotations

import contextlib
import time

from ...autograd.engine import backward as autograd_backward
from ...autograd.grad_mode import no_grad
from ...autograd.split_backward import backward_input, input_half_only
from ...tensor import Tensor
from .pipeline_schedules import (chunk_stage, check_schedule, forward_only_order, stage_chunks, stage_order,
                                 timetable)


class PipelineParallel:
    def __init__(self, chunks, group, schedule="1f1b", virtual=1):
        self.chunks = list(chunks)
        self.group, self.stages, self.stage = group, group.size, group.rank
        self.schedule, self.virtual = schedule, int(virtual)
        if len(self.chunks) != self.virtual:
            raise ValueError(f"PipelineParallel: expected {self.virtual} model chunks on this stage (virtual), got "
                             f"{len(self.chunks)}")
        self.num_chunks = self.stages * self.virtual
        self.chunk_ids = stage_chunks(schedule, self.stages, self.virtual, self.stage)  # model chunk of each local one
        self._owners = [chunk_stage(schedule, self.stages, self.virtual, c) for c in range(self.num_chunks)]
        self.data_parallel = False  # the chunks are DistributedDataParallel wrappers (set_data_parallel)
        self._tables = {}
        self.stats = {}  # of the last train_step: busy and total seconds, live activations

    def set_data_parallel(self, wrappers):
        """Run each local chunk through its DistributedDataParallel wrapper (in local order): the schedule makes a
        chunk's last backward of each step the one that averages its gradients, overlapping the rest of the
        schedule, and its other backwards accumulate locally."""
        if len(wrappers) != len(self.chunks):
            raise ValueError(f"PipelineParallel.set_data_parallel: expected {len(self.chunks)} wrappers (one per local "
                             f"chunk), got {len(wrappers)}")
        self.chunks = list(wrappers)
        self.data_parallel = True

    # ------------------------------------------------------------------------------------------- layout
    def owner(self, chunk):
        """The stage that runs model chunk ``chunk``."""
        return self._owners[chunk]

    def local(self, chunk):
        return self.chunks[self.chunk_ids.index(chunk)]

    def is_first(self, chunk):
        return chunk == 0

    def is_last(self, chunk):
        return chunk == self.num_chunks - 1

    @property
    def owns_last(self):
        """Whether this stage runs the last model chunk (the loss)."""
        return self.owner(self.num_chunks - 1) == self.stage

    def _table(self, micro_batches, forward_only):
        key = (micro_batches, forward_only)
        if key not in self._tables:
            P, V = self.stages, self.virtual
            if forward_only:
                orders = [forward_only_order(P, V, micro_batches, s, self.schedule) for s in range(P)]
            else:
                check_schedule(self.schedule, P, V, micro_batches)
                orders = [stage_order(self.schedule, P, V, micro_batches, s) for s in range(P)]
            self._tables[key] = timetable(orders, P, V, self.schedule)
        return self._tables[key]

    def _tag(self, kind, chunk, mb, micro_batches, part=0, parts=1):
        return (((chunk * micro_batches + mb) * 2 + (kind != "F")) * parts + part) % 32768

    def _destination(self, kind, chunk):
        """The stage a message produced by ``kind`` of ``chunk`` goes to (None: none is produced; W produces
        nothing, F of the last chunk neither, a backward of the first neither). It may be this stage (a V)."""
        if kind == "F":
            return None if self.is_last(chunk) else self.owner(chunk + 1)
        if kind == "W":
            return None
        return None if self.is_first(chunk) else self.owner(chunk - 1)

    # -------------------------------------------------------------------------------------------- train
    def train_step(self, inputs, targets, parts, device, backward=None, forward_context=None, batch_contexts=None):
        """Forward and backward of every micro-batch (``inputs[m]``, ``targets[m]``: Tensors; every stage passes
        the same lists); ``parts``: the activations' [(shape, dtype)]. ``backward(loss)`` runs the backward of a
        micro-batch's loss on the last stage (default ``loss.backward()``: scale it there, e.g. by 1 / M or a
        GradScaler); forwards run under ``forward_context()`` (e.g. autocast) and micro-batch m's, on every stage,
        under ``batch_contexts[m]()`` too (e.g. its packed documents' layout). Returns the micro-batch losses
        (floats) on the stage of the last chunk, None elsewhere."""
        forward_context = forward_context or contextlib.nullcontext
        M = len(inputs)
        table = self._table(M, forward_only=False)
        run = _Step(self, inputs, targets, list(parts), device, backward, forward_context,
                    batch_contexts or [contextlib.nullcontext] * M)
        start = time.perf_counter()
        for row in table:
            action = row[self.stage]
            ops = run.act(action) if action is not None else []
            ops += self._receives(row, run.received, run.parts, device, M)
            if ops:
                works = self.group.batch_isend_irecv([op[:4] for op in ops])
                for op, work in zip(ops, works):
                    if op[0] == "send":
                        run.sends.append((work, op[1]))
                    else:
                        run.received.setdefault(op[4], []).append((op[1], work))
            run.sends = [(w, a) for w, a in run.sends if not w.is_completed()]
        for work, _ in run.sends:
            work.wait()
        self.stats = {"busy_s": run.busy, "total_s": time.perf_counter() - start, "ticks": len(table),
                      "peak_live_microbatches": run.peak, "peak_weight_bytes": run.peak_weight_bytes}
        return [run.losses[m] for m in range(M)] if self.owns_last else None

    def _receives(self, row, received, parts, device, M):
        """Receive ops for the messages the other stages produce at this tick for this one (one per part)."""
        ops = []
        for stage, action in enumerate(row):
            if action is None or stage == self.stage or self._destination(action.kind, action.chunk) != self.stage:
                continue
            key = ("F" if action.kind == "F" else "G", action.chunk, action.mb)
            for i, buffer in enumerate(_buffers(parts, device)):
                ops.append(("recv", buffer, stage, self._tag(action.kind, action.chunk, action.mb, M, i, len(parts)),
                            key))
        return ops

    @staticmethod
    def _arrived(pending, device, requires_grad=False):
        """The received parts as a Tensor (one part) or a tuple of them, once their transfers completed (leaves
        that take a gradient: an activation whose gradient goes back to the previous stage)."""
        tensors = []
        for array, work in pending:
            if work is not None:  # (None: handed over on this stage)
                work.wait()
            x = Tensor._make(array, device)
            tensors.append(x.requires_grad_(True) if requires_grad else x)
        return _packed(tensors)

    def _sends(self, kind, chunk, mb, M, tensors, destination):
        return [("send", t.array, destination, self._tag(kind, chunk, mb, M, i, len(tensors)))
                for i, t in enumerate(tensors)]

    @staticmethod
    def _check_activation(out, parts, chunk):
        """The parts of chunk ``chunk``'s activation ``out``, checked against ``parts``."""
        tensors = _unpacked(out, len(parts))
        ok = tensors is not None and all(isinstance(t, Tensor) and tuple(t.shape) == tuple(shape) and t.dtype == dtype
                                         for t, (shape, dtype) in zip(tensors, parts))
        if not ok:
            got = (", ".join(f"shape {tuple(t.shape)} and dtype {t.dtype}" if isinstance(t, Tensor)
                             else type(t).__name__ for t in (out if isinstance(out, tuple) else (out,))))
            want = ", ".join(f"shape {tuple(shape)} and dtype {dtype}" for shape, dtype in parts)
            raise ValueError(f"pipeline: model chunk {chunk} produced ({got}), expected {len(parts)} Tensor(s) of "
                             f"({want}) to send to the next stage\nHINT: every chunk but the last returns the "
                             "activation the next chunk takes")
        return tensors

    # ------------------------------------------------------------------------------------------ forward
    @no_grad()
    def forward(self, x, parts, device, **kwargs):
        """One input through every chunk in order; returns the last chunk's output on its stage, None elsewhere.
        ``kwargs`` go to every chunk (e.g. a KV cache); the last also gets ``targets`` if given."""
        targets = kwargs.pop("targets", None)
        out = None
        for c in range(self.num_chunks):
            if self.owner(c) != self.stage:
                continue
            if not self.is_first(c) and self.owner(c - 1) != self.stage:
                buffers = _buffers(parts, device)
                for i, buffer in enumerate(buffers):
                    self.group.recv(Tensor._make(buffer, device), self.owner(c - 1),
                                    self._tag("F", c - 1, 0, 1, i, len(parts)))
                x = _packed([Tensor._make(b, device) for b in buffers])
            out = self.local(c)(x, targets, **kwargs) if self.is_last(c) else self.local(c)(x, None, **kwargs)
            if not self.is_last(c):
                tensors = self._check_activation(out, parts, c)
                if self.owner(c + 1) != self.stage:
                    for i, t in enumerate(tensors):
                        self.group.send(t, self.owner(c + 1), self._tag("F", c, 0, 1, i, len(parts)))
                x = out
        return out if self.owns_last else None


def _buffers(parts, device):
    xp = device.array_module()
    with device.context():
        return [xp.empty(shape, dtype) for shape, dtype in parts]


def _packed(tensors):
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


def _unpacked(out, count):
    """The parts of an activation as a list (None when there are not ``count`` of them)."""
    tensors = list(out) if isinstance(out, tuple) else [out]
    return tensors if len(tensors) == count else None


class _Step:
    """The state of one train_step on this stage: what each action needs and leaves, and the time it computes
    (waiting for a transfer is not computing: the bubble is measured from it).

    Actions: F (forward), B (whole backward), I (the backward's input half: the gradient the previous chunk waits
    for) and W (its weight half, run later: autograd/split_backward.py). An activation is held from its F until its
    B or W; ``held_weight_bytes`` is what the pending W's keep meanwhile."""

    def __init__(self, pipe, inputs, targets, parts, device, backward, forward_context, batch_contexts):
        self.pipe, self.inputs, self.targets = pipe, inputs, targets
        self.parts, self.device = parts, device
        self.backward = backward or Tensor.backward
        self.forward_context, self.batch_contexts = forward_context, batch_contexts
        self.M = len(inputs)
        self.kept_in, self.kept_out, self.received, self.sends, self.losses = {}, {}, {}, [], {}
        self.weight_halves = {}  # (chunk, mb) -> (the WeightGradients its I left for its W, the bytes they hold)
        self.weight_passes_left = {}  # per chunk, with data-parallel wrappers: its last B or W averages
        self.busy, self.live, self.peak = 0.0, 0, 0
        self.held_weight_bytes = self.peak_weight_bytes = 0

    def act(self, action):
        """Run one action; returns the send ops for what it produced. Its compute time counts as busy from the
        moment what it waits for (a transfer) has arrived."""
        if action.kind == "F":
            return self._forward(action.chunk, action.mb)
        if action.kind == "W":
            return self._weight_half(action.chunk, action.mb)
        return self._backward(action.chunk, action.mb, split=action.kind == "I")

    @contextlib.contextmanager
    def _computing(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy += time.perf_counter() - t0

    def _forward(self, c, m):
        pipe = self.pipe
        x = self.inputs[m] if pipe.is_first(c) else pipe._arrived(self.received.pop(("F", c - 1, m)), self.device,
                                                                  True)
        with self._computing():
            with self.forward_context(), self.batch_contexts[m]():
                out = pipe.local(c)(x, self.targets[m] if pipe.is_last(c) else None)
            self.kept_in[(c, m)] = x
            self.live += 1
            self.peak = max(self.peak, self.live)
            if pipe.is_last(c):
                self.kept_out[(c, m)] = out[1]
                self.losses[m] = float(out[1].item())
                return []
            tensors = pipe._check_activation(out, self.parts, c)
            self.kept_out[(c, m)] = tensors
            return self._send("F", c, m, tensors)

    def _backward(self, c, m, split):
        pipe = self.pipe
        out = self.kept_out.pop((c, m))
        grads = None if pipe.is_last(c) else _unpacked(pipe._arrived(self.received.pop(("G", c + 1, m)), self.device),
                                                       len(self.parts))
        with self._computing():
            received = [] if pipe.is_first(c) else _unpacked(self.kept_in[(c, m)], len(self.parts))
            wanted = [t for t in received if t.requires_grad]
            if not split:
                self._before_weight_pass(c)
            halves = []
            if grads is None:  # the loss: the caller's backward scales it (1 / M, a GradScaler)
                with input_half_only(wanted) if split else contextlib.nullcontext() as halves:
                    self.backward(out)
            else:  # the parts that do not depend on this chunk's inputs or weights take no part in its backward
                roots = [(t, g) for t, g in zip(out, grads) if t.requires_grad]
                if split:
                    halves = [backward_input([t for t, _ in roots], [g for _, g in roots], wanted)]
                else:
                    autograd_backward([t for t, _ in roots], [g for _, g in roots])
            if split:
                held = sum(h.held_bytes for h in halves)
                self.weight_halves[(c, m)] = halves, held
                self.held_weight_bytes += held
                self.peak_weight_bytes = max(self.peak_weight_bytes, self.held_weight_bytes)
            else:
                self._release(c, m)
            if pipe.is_first(c):
                return []
            back = [t.grad if t.grad is not None else Tensor._make(t.array * 0, self.device) for t in received]
            return self._send("G", c, m, back)

    def _weight_half(self, c, m):
        with self._computing():
            halves, held = self.weight_halves.pop((c, m))
            self.held_weight_bytes -= held
            self._before_weight_pass(c)
            for half in halves:
                half.backward_weight()
            self._release(c, m)
        return []

    def _before_weight_pass(self, c):
        """With data-parallel wrappers, a chunk's last pass that accumulates weight gradients averages them."""
        if self.pipe.data_parallel:
            left = self.weight_passes_left[c] = self.weight_passes_left.get(c, self.M) - 1
            self.pipe.local(c).prepare_backward(sync=left == 0)

    def _release(self, c, m):
        del self.kept_in[(c, m)]
        self.live -= 1

    def _send(self, kind, c, m, tensors):
        """Send ops for what an action produced, or, for the next chunk on this stage (a V), a copy kept here."""
        pipe = self.pipe
        destination = pipe.owner(c + 1) if kind == "F" else pipe.owner(c - 1)
        if destination != pipe.stage:
            return pipe._sends(kind, c, m, self.M, tensors, destination)
        self.received[(kind, c, m)] = [(t.array.copy(), None) for t in tensors]
        return []


__all__ = ["PipelineParallel"]
