"""Profiling steps of a run (the ``profile`` config section): the profiler runs from the start of step
``profile.start_step`` for ``profile.num_steps`` steps, each step a ``ProfilerStep#N`` range with the model's
module calls as ranges inside. When it stops:

- every rank writes ``out_dir/profile/trace_rank{R}.json`` (its Chrome trace, pid = rank);
- rank 0 gathers every rank's trace through the run's process group and writes ``out_dir/profile/trace.json``
  (one process per rank: open it in ui.perfetto.dev) and ``out_dir/profile/ops.txt``, its op table as torch
  prints it (sorted by self CPU time; by input shape too with ``profile.record_shapes``).
"""
from __future__ import annotations

import json
import os


from .. import distributed as dist
from ..atomic_file import write_text_atomically
from ..autograd import observers
from ..profiler import merge_traces, module_ranges, profile
from ..profiler.chrome_trace import write_json_atomic


def gather_traces(trace):
    """Every rank's trace dict, in rank order, on every rank."""
    traces = [None] * dist.get_world_size()
    dist.all_gather_object(traces, trace)
    return traces


class RunProfiler:
    """``begin(step)`` before and ``end(step)`` after each training step; profiles the configured steps."""

    def __init__(self, cfg, model):
        self.settings = cfg.profile
        self.out_dir = os.path.join(cfg.out_dir, "profile")
        self.model = model
        start, count = self.settings.start_step, self.settings.num_steps
        self.last = min(start + count, cfg.train.num_iterations) - 1
        self.enabled = start >= 0
        self.prof = self.modules = self.step_range = None
        self.first = None

    def begin(self, step):
        if not self.enabled:
            return
        if self.prof is None and self.settings.start_step <= step <= self.last:
            self.prof = profile(record_shapes=self.settings.record_shapes).start()
            self.modules = module_ranges(self.model)
            self.modules.__enter__()
            self.first = step
        if self.prof is not None:
            self.step_range = observers.record(f"ProfilerStep#{step}", "user")
            self.step_range.__enter__()

    def end(self, step):
        if self.prof is None:
            return
        self.step_range.__exit__(None, None, None)
        if step >= self.last:
            self._finish(step)

    def _finish(self, step):
        prof = self.prof
        self.modules.__exit__(None, None, None)
        prof.stop()
        self.prof = self.modules = self.step_range = None
        self.enabled = False  # once per run
        rank = dist.get_rank()
        os.makedirs(self.out_dir, exist_ok=True)
        path = prof.export_chrome_trace(os.path.join(self.out_dir, f"trace_rank{rank}.json"), pid=rank)
        with open(path) as f:
            mine = json.load(f)
        traces = gather_traces(mine)
        if rank != 0:
            return
        write_json_atomic(os.path.join(self.out_dir, "trace.json"), merge_traces(traces, list(range(len(traces)))))
        steps = f"step {self.first}" if step == self.first else f"steps {self.first}-{step}"
        text = (f"profile of {steps} on rank 0 ({prof.wall_time_us / 1000:.1f} ms wall time; {len(traces)} rank(s) "
                f"in trace.json)\n\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=-1))
        if self.settings.record_shapes:
            text += "\nby input shape:\n" + prof.key_averages(group_by_input_shape=True).table(
                sort_by="self_cpu_time_total", row_limit=-1)
        write_text_atomically(os.path.join(self.out_dir, "ops.txt"), text)
        print(f"profile of {steps}: {self.out_dir}/trace.json (open in ui.perfetto.dev), ops.txt", flush=True)


__all__ = ["RunProfiler", "gather_traces"]
