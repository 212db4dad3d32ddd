"""The numerics checker: statistics of every module output (and, at level 2, every op) of a model, forward and
backward, as JSON lines, so that two runs (two frameworks, two devices, two precisions) can be compared entry by
entry with ``python -m infini_train.tools.compare_numerics A B`` to find the first place they differ.

    with NumericsChecker(2, "x.jsonl", model=model) as check:
        for step in range(3):
            with check.recording(step):
                loss = model(x, y)[1]
                loss.backward()

Each line: ``{"step", "phase", "name", "shape", "dtype", "min", "max", "mean", "absmax", "nan", "inf", "hash"}``
(the statistics of infini_train.training.tensor_stats). Phases and names:
- level 1: "forward" for each module output, named by the module's path (``transformer.h.0.attn``; the root
  module is ``model``; the i-th tensor of a tuple output gets ``[i]``); "backward" for the gradient of each such
  output (a tensor hook); "grad" for the gradient each backward pass produces for a parameter (its name).
- level 2 adds every op: its outputs ("forward", ``<module path>/<Op>#<k>``, k counting that op within one call
  of the innermost module running it, so names line up between two runs of the same model) and the gradients its
  backward hands to its inputs ("backward", ``<op name>:grad<input index>``). Ops outside the model's modules
  are under ``(outside)``.

Under loss scaling (fp16-mixed: a GradScaler multiplies the loss before backward) the "backward" and "grad" entries
hold the values the scaler's unscale gives back: min, max, mean and absmax divided by the step's loss scale, which
the entry records as "loss_scale" (its hash is of the tensor as backward produced it), so that an fp16-mixed run
compares by value with an fp32 one (``compare_numerics --ignore-dtype``).

Under activation recomputation a block's forward runs again in backward: those forwards write no entries, but
their gradients are the ones recorded, so the entries equal a run without recomputation. A name repeats when a
module runs several times in a step (micro-batches); the compare tool matches the k-th occurrence with the k-th.
Lines are written one whole step at a time (at the end of each ``recording``).
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from functools import partial

from ..atomic_file import write_text_atomically
from ..autograd import observers
from ..tensor import Tensor, array_of
from .tensor_stats import dtype_name, tensor_stats

LEVELS = (0, 1, 2)
STATS = ("min", "max", "mean", "absmax")  # the statistics a loss scale divides
OUTSIDE = "(outside)"


class _Frame:
    __slots__ = ("module", "label", "counts")

    def __init__(self, module, label):
        self.module, self.label, self.counts = module, label, {}


class _ThreadState(threading.local):
    """Per thread: the frames of the modules running (innermost last), the depth of backward passes running, and the
    frame of the ops outside every module."""

    def __init__(self):
        self.stack, self.depth, self.outside = [], 0, _Frame(None, OUTSIDE)


def _tensors(out):
    """[(suffix, tensor)] of a module's or op's output: "" for a lone tensor, "[i]" for the tensors of a tuple."""
    if isinstance(out, Tensor):
        return [("", out)]
    if isinstance(out, (tuple, list)):
        return [(f"[{i}]", t) for i, t in enumerate(out) if isinstance(t, Tensor)]
    return []


def keep_steps_before(path, step):
    """Drop the lines of ``path`` at or after ``step`` (a resumed run rewrites them), atomically."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line).get("step", 0) < step]
    write_text_atomically(path, "".join(kept))


class NumericsChecker(observers.OpObserver):
    """Records the statistics of ``model``'s tensors at ``level`` (0 off, 1 modules, 2 every op) into the JSONL
    file ``path``. ``start()`` (or ``with``) attaches it; entries are taken while ``active`` (True by default; a
    run turns it on only inside ``recording(step)``, so validation passes are left out); ``close()`` detaches.
    ``keep_before``: keep the lines of an existing file with steps before this (a resumed run), else start empty.
    ``loss_scale``: a callable giving the loss scale of the step ``recording`` starts (a GradScaler's get_scale)."""

    def __init__(self, level, path, rank=0, model=None, active=True, keep_before=None, loss_scale=None):
        if level not in LEVELS:
            raise ValueError(f"NumericsChecker: expected level 0 (off), 1 (module outputs and gradients) or 2 "
                             f"(every op too), got {level!r}\nHINT: numerics.level=1 is the usual start")
        if level and model is None:
            raise ValueError("NumericsChecker: expected a model (an nn.Module) to watch, got None\n"
                             "HINT: NumericsChecker(level, path, model=model)")
        self.level, self.path, self.rank, self.model = level, path, rank, model
        self.active, self.step = active, 0
        self.keep_before = keep_before
        self.loss_scale, self._scale = loss_scale, None
        self._entries, self._lock, self._local = [], threading.Lock(), _ThreadState()
        self._handles, self._file, self._started = [], None, False

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self):
        if self._started or not self.level:
            return self
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        if self.keep_before is not None:
            keep_steps_before(self.path, self.keep_before)
        self._file = open(self.path, "a" if self.keep_before is not None else "w")
        for name, module in self.model.named_modules():
            label = name or "model"
            self._handles.append(module.register_forward_pre_hook(partial(self._enter_module, label)))
            self._handles.append(module.register_forward_hook(partial(self._leave_module, label)))
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                self._handles.append(param.register_hook(partial(self._param_grad, name)))
        observers.install(self)
        self._started = True
        return self

    def close(self):
        """Detach from the model and write what is buffered (safe to call twice)."""
        if not self._started:
            return
        observers.uninstall(self)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.flush()
        self._file.close()
        self._started = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    @contextlib.contextmanager
    def recording(self, step):
        """Take entries for ``step`` inside the block; its lines are written when the block ends."""
        was = self.active
        self.set_step(step)
        self.active = True
        self._scale = self.loss_scale() if self.loss_scale is not None else None
        try:
            yield self
        finally:
            self.active, self._scale = was, None
            self.flush()

    def set_step(self, step):
        """Entries from now on carry ``step`` (what was buffered for the previous step is written first)."""
        self.flush()
        self.step = int(step)
        self._local.depth = 0  # a backward that raised never decremented it
        self._local.outside = _Frame(None, OUTSIDE)

    def flush(self):
        with self._lock:
            entries, self._entries = self._entries, []
        if entries and self._file is not None:
            self._file.write("".join(json.dumps(e) + "\n" for e in entries))
            self._file.flush()

    # ---------------------------------------------------------------------------------------------- entries
    def record(self, phase, name, tensor_or_array):
        """Append one entry (the statistics of a Tensor or an array) for the current step."""
        array = array_of(tensor_or_array)
        entry = {"step": self.step, "phase": phase, "name": name, "shape": list(array.shape),
                 "dtype": dtype_name(array.dtype)}
        entry.update(tensor_stats(array))
        if self._scale is not None and phase in ("backward", "grad"):  # scaled by the loss scale: unscaled here
            entry.update({k: entry[k] / self._scale for k in STATS if entry[k] is not None}, loss_scale=self._scale)
        with self._lock:
            self._entries.append(entry)

    def _enter_module(self, label, module, args):
        self._local.stack.append(_Frame(module, label))

    def _leave_module(self, label, module, args, out):
        state = self._local
        while state.stack:  # down to this module's frame (a forward that raised left its own above it)
            if state.stack.pop().module is module:
                break
        if not self.active:
            return
        recomputing = state.depth > 0  # a forward run again in backward (activation recomputation)
        for suffix, t in _tensors(out):
            name = label + suffix
            if not recomputing:
                self.record("forward", name, t)
            if t.requires_grad:
                t.register_hook(partial(self._output_grad, name))

    def _output_grad(self, name, grad):
        if self.active:
            self.record("backward", name, grad)

    def _param_grad(self, name, grad):
        if self.active:
            self.record("grad", name, grad)

    # ------------------------------------------------------------------------------- op observer (level 2)
    def forward_end(self, token, fn, inputs, outputs):
        if self.level < 2 or not self.active:
            return
        state = self._local
        frame = state.stack[-1] if state.stack else state.outside
        op = fn.name
        count = frame.counts.get(op, 0)
        frame.counts[op] = count + 1
        name = f"{frame.label}/{op}#{count}"
        fn._precision_name = name  # the backward entries of this node carry its forward name
        if state.depth == 0:
            for suffix, t in _tensors(outputs):
                self.record("forward", name + suffix, t)

    def backward_begin(self, fn, grad_outputs):
        self._local.depth += 1

    def backward_end(self, token, fn, grad_inputs):
        state = self._local
        state.depth = max(state.depth - 1, 0)
        name = fn._precision_name
        if self.level < 2 or not self.active or name is None:
            return
        inputs = [k for k, (nxt, _) in enumerate(fn.next_functions) if nxt is not None]
        for j, (_, grad, _) in enumerate(grad_inputs):
            if grad is not None:
                k = inputs[j] if len(inputs) == len(grad_inputs) else j
                self.record("backward", f"{name}:grad{k}", grad)


__all__ = ["NumericsChecker", "LEVELS", "keep_steps_before"]
