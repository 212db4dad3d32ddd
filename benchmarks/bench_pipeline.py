"""Pipeline schedules measured: bubble fraction against theory, and peak activation memory per stage.

    mpiexec -n 2 python benchmarks/bench_pipeline.py [--layers 8] [--embd 256] [--batch 4] [--seq 128] [--micro 8]
    mpiexec -n 4 python benchmarks/bench_pipeline.py --schedules gpipe 1f1b

Each rank is one stage of a GPT-2 (PipelinedLM) and runs full training steps (every micro-batch forward and
backward, as the run loop does) for each schedule (interleaved with --virtual chunks per stage, zbv and dualpipev with
two in a V; a schedule the sizes cannot run is listed as refused).

- Bubble: a stage's idle fraction of the step, 1 - (time spent in its forwards and backwards, both halves of a split
  one) / (step time), median of --steps steps after a warm-up, averaged over the stages; beside it the ideal
  (P-1)/(M+P-1) (interleaved: (P-1)/(V M+P-1); the split schedules: their event simulation with F = I = W = 1,
  B = 2), which assumes equal stage times and free communication, per stage too.
- Memory: the peak of the bytes the step allocates beyond what was live before it (parameters and gradients
  excluded: they exist before the step), traced by tracemalloc in a separate step; mostly activations kept
  for backward. Also the schedule's own count of micro-batches held at once, and (split schedules) the peak bytes
  the pending weight halves keep between their I and W.

Timings need one core per rank (with more ranks than cores the stages take turns, which is not a bubble).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tracemalloc

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.pipeline_lm import PipelinedLM
from infini_train.nn.parallel.pipeline_schedules import (SPLIT_SCHEDULES, V_SCHEDULES, ScheduleError, check_schedule,
                                                         ideal_bubble, simulate, stage_order)


def build(args, group, schedule, virtual):
    it.manual_seed(0)
    config = GPT2Config(block_size=args.seq, vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads,
                        n_embd=args.embd)
    return PipelinedLM(GPT2(config), group, schedule, virtual)


def step(stage, inputs, targets):
    for p in stage.parameters():
        p.grad = None
    M = len(inputs)
    stage.train_step(inputs, targets, backward=lambda loss: (loss / M).backward())
    return stage.pipe.stats


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro", type=int, default=8, help="micro-batches per step (M)")
    p.add_argument("--virtual", type=int, default=2, help="model chunks per stage for interleaved (V)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zb1p", "zbv", "dualpipev"])
    p.add_argument("--json", action="store_true", help="print one JSON line per schedule as well")
    args = p.parse_args()
    dist.init_process_group()
    group, rank, P = dist.default_group(), dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)
    inputs = [it.tensor(rng.integers(0, args.vocab, (args.batch, args.seq))) for _ in range(args.micro)]
    targets = [it.tensor(rng.integers(0, args.vocab, (args.batch, args.seq))) for _ in range(args.micro)]
    if rank == 0:
        print(f"GPT-2 {args.layers} layers x {args.embd}, B{args.batch} T{args.seq}, M={args.micro} micro-batches, "
              f"P={P} stages")
        print(f"{'schedule':<12} {'V':>2} {'step ms':>8} {'bubble':>7} {'ideal':>6} {'per stage':<24} "
              f"{'ideal per stage':<24} {'peak act. MB per stage':<28} {'held mb':<12} {'W-pending MB'}")
    for schedule in args.schedules:
        virtual = 2 if schedule in V_SCHEDULES else args.virtual if schedule == "interleaved" else 1
        try:
            check_schedule(schedule, P, virtual, args.micro)
        except ScheduleError as exc:
            if rank == 0:
                print(f"{schedule:<12} {virtual:>2} refused: {str(exc).splitlines()[0]}", flush=True)
            continue
        stage = build(args, group, schedule, virtual)
        step(stage, inputs, targets)  # warm-up
        bubbles, totals = [], []
        for _ in range(args.steps):
            stats = step(stage, inputs, targets)
            bubbles.append(1 - stats["busy_s"] / stats["total_s"])
            totals.append(stats["total_s"])
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        stats = step(stage, inputs, targets)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        mine = np.array([statistics.median(bubbles), statistics.median(totals), peak,
                         stats["peak_live_microbatches"], stats["peak_weight_bytes"]], np.float64)
        rows = [np.zeros(5) for _ in range(P)]
        group.all_gather(rows, mine)
        if rank == 0:
            bubble = float(np.mean([r[0] for r in rows]))
            ideal = ideal_bubble(schedule, P, virtual, args.micro)
            ideals = simulate([stage_order(schedule, P, virtual, args.micro, s) for s in range(P)], P, virtual,
                              schedule)
            step_ms = max(r[1] for r in rows) * 1000
            per_stage = " ".join(f"{r[0]:.2f}" for r in rows)
            ideal_per_stage = " ".join(f"{v:.2f}" for v in ideals)
            memory = " ".join(f"{r[2] / 2 ** 20:.1f}" for r in rows)
            held = " ".join(str(int(r[3])) for r in rows)
            pending = " ".join(f"{r[4] / 2 ** 20:.1f}" for r in rows) if schedule in SPLIT_SCHEDULES else "-"
            print(f"{schedule:<12} {virtual:>2} {step_ms:>8.1f} {bubble:>7.3f} {ideal:>6.3f} {per_stage:<24} "
                  f"{ideal_per_stage:<24} {memory:<28} {held:<12} {pending}", flush=True)
            if args.json:
                print(json.dumps({"schedule": schedule, "P": P, "V": virtual, "M": args.micro, "step_ms": step_ms,
                                  "bubble": bubble, "ideal": ideal, "bubble_per_stage": [r[0] for r in rows],
                                  "ideal_per_stage": list(ideals),
                                  "peak_activation_bytes": [int(r[2]) for r in rows],
                                  "held_microbatches": [int(r[3]) for r in rows],
                                  "weight_pending_bytes": [int(r[4]) for r in rows]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
