"""What a checkpoint costs the steps around it, synchronous vs ``train.checkpoint_async``: GPT-2 124M shapes with the
byte vocabulary (85.8M parameters, 1.03 GB of fp32 parameters and AdamW moments), B4 T64, a checkpoint every
``--every`` steps, one process (whole format) and ZeRO-3 on 4 ranks (sharded), one BLAS thread per rank.

Each case runs the training in-process under mpiexec (``--child``) with timers around every step and every save:
a step "overlaps" a save when it is the step the save follows (its time plus the save's stall at the boundary) or
when it runs while a background writer is still writing. Reported per case: the steady step (median of the steps
that overlap no save), the stall of each save on the main thread, the overlapping steps' times as multiples of the
steady step (mean and worst), and each rank's peak resident memory in the save phase (the staging copies for
async). Rank 0's figures; every rank stalls alike. Nothing here is a test.

    python benchmarks/bench_async_checkpoint.py [--cases one-sync,one-async,zero3x4-sync,zero3x4-async] [--steps 13]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CASES = {  # name: (ranks, overrides)
    "one-sync": (1, []),
    "one-async": (1, ["train.checkpoint_async=true"]),
    "zero3x4-sync": (4, ["parallel.zero_stage=3"]),
    "zero3x4-async": (4, ["parallel.zero_stage=3", "train.checkpoint_async=true"]),
}


def child(args, out_json):
    """Run the training with timers (in each rank's process); rank 0 writes the timings to ``out_json``."""
    from infini_train import distributed as dist
    from infini_train.run_state import async_save
    from infini_train.training import loop
    from infini_train.training.config import parse_args

    steps, saves, writes = [], [], []
    train_step, save, start = loop.train_step, loop.Run.save, async_save.AsyncSaver.start

    def timed_step(*a, **k):
        t0 = time.perf_counter()
        result = train_step(*a, **k)
        steps.append((t0, time.perf_counter()))
        return result

    def timed_save(self, step, final=True):
        t0 = time.perf_counter()
        path = save(self, step, final)
        if not final:
            saves.append((t0, time.perf_counter()))
        return path

    def timed_start(self, step, job, staged):
        def job_timed():
            job()
            writes.append(time.perf_counter())
        return start(self, step, job_timed, staged)

    loop.train_step, loop.Run.save, async_save.AsyncSaver.start = timed_step, timed_save, timed_start
    run = loop.Run(parse_args(args))
    run.train()
    if dist.get_rank() == 0:
        with open(os.path.join(run.cfg.out_dir, "metrics.jsonl")) as f:
            memory = [json.loads(line) for line in f][-1]["memory"]
        with open(out_json, "w") as f:
            json.dump({"steps": steps, "saves": saves, "writes": writes, "memory": memory}, f)


def summarise(timings):
    steps, saves, writes = timings["steps"], timings["saves"], timings["writes"]
    overlapping = {}
    for k, (s0, s1) in enumerate(saves):
        before = max(i for i, (t0, _) in enumerate(steps) if t0 < s0)  # the step the save follows
        t0, t1 = steps[before]
        overlapping[before] = (t1 - t0) + (s1 - s0)
        done = writes[k] if k < len(writes) else s1
        for i, (a, b) in enumerate(steps):
            if i != before and a < done and b > s1:  # ran while the writer wrote
                overlapping[i] = b - a
    steady = statistics.median(b - a for i, (a, b) in enumerate(steps) if i >= 2 and i not in overlapping)
    ratios = [v / steady for v in overlapping.values()]
    return {"steady_s": steady, "stall_s": [b - a for a, b in saves], "overlap_mean": statistics.mean(ratios),
            "overlap_max": max(ratios), "overlapping_steps": len(ratios),
            "save_rss_mb": timings["memory"]["peak_rss_mb"]["save"],
            "steady_rss_mb": timings["memory"]["peak_rss_mb"]["steady"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--every", type=int, default=4)
    if sys.argv[1:2] == ["--child"]:  # one run's ranks: --child TIMINGS_JSON TRAIN_ARGS...
        return child(sys.argv[3:], sys.argv[2])
    args = parser.parse_args()
    from tests.distributed.mpi_jobs import MPIEXEC
    from tests.training.tiny_run import make_data

    root = tempfile.mkdtemp(prefix="bench_async_")
    data = make_data(os.path.join(root, "data"))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", TQDM_DISABLE="1")
    print(f"{'case':16s}{'steady s':>10s}{'save stalls s':>22s}{'overlap mean':>14s}{'worst':>8s}"
          f"{'save RSS MB (per rank)':>30s}")
    for name in args.cases.split(","):
        ranks, overrides = CASES[name]
        out, timings = os.path.join(root, name), os.path.join(root, f"{name}.json")
        train = ["--config", os.path.join(REPO, "configs", "gpt2_124m.yaml"), f"out_dir={out}",
                 f"data.train={data}/train_*.bin", "data.val=null", "data.tokenizer=byte", "model.vocab_size=257",
                 "model.block_size=64", "train.batch_size=4", "train.sequence_length=64",
                 "train.total_batch_size=1024", f"train.num_iterations={args.steps}", f"train.save_every={args.every}",
                 "train.keep_last=2", "train.val_loss_every=0", "train.sample_every=0", "train.warmup_iters=1",
                 "plot=false", "device=cpu", *overrides]
        cmd = [sys.executable, os.path.abspath(__file__), "--child", timings, *train]
        if ranks > 1:
            cmd = [MPIEXEC, "-n", str(ranks), *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        with open(timings) as f:
            r = summarise(json.load(f))
        stalls = " ".join(f"{s:.2f}" for s in r["stall_s"])
        rss = " ".join(f"{v:.0f}" for v in r["save_rss_mb"])
        print(f"{name:16s}{r['steady_s']:10.2f}{stalls:>22s}{r['overlap_mean']:14.2f}{r['overlap_max']:8.2f}"
              f"{rss:>30s}", flush=True)


if __name__ == "__main__":
    main()
