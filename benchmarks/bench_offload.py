"""What offloading the optimizer state to disk (``train.optimizer_offload: disk``) costs in step time, and what it
saves in resident memory. Nothing here is a test.

``step``: one AdamW step alone over a flat parameter of N elements (default 42.9M: one rank's half of GPT-2 124M's
85.8M parameters with the byte vocabulary under ZeRO-3 x 2), its state in memory, on disk with the next chunk read
ahead on a background thread, and on disk without; median of the steps after the first; the state file in the page
cache, as it is between a run's steps.

``runs``: whole ZeRO-3 runs of GPT-2 124M shapes (byte vocabulary, B4 T64) under mpiexec, in memory and on disk
alternated pair by pair; each run's median step time after its first steps (metrics.jsonl) and the largest rank's
peak resident memory by phase (the run's own records), and the ratio disk / memory of each pair.

    python benchmarks/bench_offload.py step
    python benchmarks/bench_offload.py runs --pairs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def optimizer_step(elements, steps):
    import infini_train as it
    from infini_train.optim import AdamW
    from infini_train.optim.offload import DiskStore

    rng = np.random.default_rng(0)
    values = rng.standard_normal(elements).astype(np.float32)
    grad = rng.standard_normal(elements).astype(np.float32)
    names = ("memory", "disk, read ahead", "disk, no read-ahead")
    with tempfile.TemporaryDirectory() as tmp:
        stores = (None, DiskStore(tmp, 0), DiskStore(tmp, 1, prefetch=False))
        params, optimizers = [], []
        for store in stores:
            p = it.Tensor(values.copy(), requires_grad=True)
            p.grad = it.Tensor(grad)
            params.append(p)
            optimizers.append(AdamW([p], lr=1e-3, weight_decay=0.1, offload=store))
        times = {name: [] for name in names}
        for _ in range(steps):  # round by round, so that the machine's drift hits every placement alike
            for name, opt in zip(names, optimizers):
                t0 = time.perf_counter()
                opt.step()
                times[name].append((time.perf_counter() - t0) * 1000)
        for name, p in zip(names[1:], params[1:]):
            assert p.numpy().tobytes() == params[0].numpy().tobytes(), f"{name}: not the in-memory update"
        for store in stores[1:]:
            store.close()
    print(f"AdamW step over {elements / 1e6:.1f}M float32 elements ({elements * 8 / 2 ** 20:.0f} MB of state), "
          f"{steps - 1} rounds after the first, one step of each placement per round:")
    for name in names:
        ratios = [t / m for t, m in zip(times[name][1:], times["memory"][1:])]
        print(f"  {name}: median {statistics.median(times[name][1:]):.1f} ms, vs memory median "
              f"{statistics.median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f})")


def run(offload, ranks, data_dir, out):
    from benchmarks.train_runs import step_records

    overrides = [f"data.train={data_dir}/train_*.bin", "data.val=null", "data.tokenizer=byte", "model.vocab_size=257",
                 "model.block_size=64", "train.batch_size=4", "train.sequence_length=64",
                 f"train.total_batch_size={256 * ranks}", "train.num_iterations=6", "train.val_loss_every=0",
                 "train.sample_every=0", "train.warmup_iters=1", "plot=false", "device=cpu",
                 "parallel.zero_stage=3", f"train.optimizer_offload={offload}"]
    records = step_records(os.path.join(REPO, "configs", "gpt2_124m.yaml"), out, overrides, ranks)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        memory = [json.loads(line) for line in f][-1]["memory"]["peak_rss_mb"]
    return statistics.median(r["ms"] for r in records[2:]), {phase: max(v) for phase, v in memory.items()}, \
        [r["loss"] for r in records]


def whole_runs(pairs, ranks):
    from tests.training.tiny_run import make_data

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        for pair in range(pairs):
            got = {kind: run(kind, ranks, data_dir, os.path.join(tmp, f"run{pair}-{kind}"))
                   for kind in ("none", "disk")}
            assert got["none"][2] == got["disk"][2], "the offloaded run's losses differ from the in-memory run's"
            ratios.append(got["disk"][0] / got["none"][0])
            for kind, (ms, peaks, _) in got.items():
                print(f"pair {pair + 1}, {kind}: {ms:.0f} ms per step; peak RSS, largest rank: " +
                      ", ".join(f"{phase} {mb:.0f} MB" for phase, mb in peaks.items()), flush=True)
    print(f"disk / memory step time, ZeRO-3 x {ranks}: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} pairs; the same losses bitwise")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("step", "runs"))
    parser.add_argument("--elements", type=int, default=42_900_000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    if args.what == "step":
        optimizer_step(args.elements, args.steps)
    else:
        whole_runs(args.pairs, args.ranks)


if __name__ == "__main__":
    main()
