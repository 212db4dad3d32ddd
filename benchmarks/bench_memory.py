"""Per-rank peak resident memory of whole training runs, by phase, for several layouts and checkpoint formats.

Each case runs examples/gpt2/train.py under mpiexec (GPT-2 124M shapes with the byte vocabulary, B4 T64, 1024 tokens
per step, 3 steps and one checkpoint, one BLAS thread per rank), then resumes it for one more step, and reads the
runs' own closing memory records from metrics.jsonl (the kernel's high-water mark per phase: build, first step,
steady state, save, and the resumed run's checkpoint load). The largest rank's figures are compared with the
one-process run's; the save and load columns are the checkpoint's wall time (slowest rank).
Nothing here is a test.

    python benchmarks/bench_memory.py                 # the default cases
    python benchmarks/bench_memory.py --cases one,pp2tp2-sharded
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CASES = {  # name: (ranks, overrides)
    "one": (1, []),
    "zero2x4-whole": (4, ["parallel.zero_stage=2", "train.checkpoint_format=whole"]),
    "zero2x4-sharded": (4, ["parallel.zero_stage=2", "train.checkpoint_format=sharded"]),
    "pp2tp2-whole": (4, ["parallel.tensor=2", "parallel.pipeline=2", "train.checkpoint_format=whole"]),
    "pp2tp2-sharded": (4, ["parallel.tensor=2", "parallel.pipeline=2", "train.checkpoint_format=sharded"]),
    "zero3x4": (4, ["parallel.zero_stage=3"]),
    "zero3x2-tp2": (4, ["parallel.zero_stage=3", "parallel.tensor=2"]),
    "pp2-zero3x2": (4, ["parallel.zero_stage=3", "parallel.pipeline=2"]),
    "hsdp2x2": (4, ["parallel.zero_stage=3", "parallel.data_replicate=2"]),
    "hsdp2x1-tp2": (4, ["parallel.zero_stage=3", "parallel.data_replicate=2", "parallel.tensor=2"]),
}
PHASES = ("build", "first_step", "steady", "save", "load")


def run_case(name, data_dir, out_root):
    from tests.distributed.mpi_jobs import MPIEXEC

    ranks, overrides = CASES[name]
    out = os.path.join(out_root, name)
    args = [sys.executable, os.path.join(REPO, "examples", "gpt2", "train.py"), "--config",
            os.path.join(REPO, "configs", "gpt2_124m.yaml"), f"out_dir={out}", f"data.train={data_dir}/train_*.bin",
            f"data.val={data_dir}/val_*.bin", "data.tokenizer=byte", "model.vocab_size=257", "model.block_size=64",
            "train.batch_size=4", "train.sequence_length=64", "train.total_batch_size=1024", "train.num_iterations=3",
            "train.val_loss_every=0", "train.sample_every=0", "train.warmup_iters=1", "plot=false", "device=cpu",
            *overrides]
    if ranks > 1:
        args = [MPIEXEC, "-n", str(ranks), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    records = []
    for extra in ([], ["train.num_iterations=4", "resume=auto"]):
        proc = subprocess.run(args + extra, capture_output=True, text=True, cwd=REPO, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records.append([json.loads(line) for line in f][-1]["memory"])
    peaks, seconds = records[0]["peak_rss_mb"], records[0]["seconds"]
    peaks["load"], seconds["load"] = records[1]["peak_rss_mb"]["load"], records[1]["seconds"]["load"]
    return peaks, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    args = parser.parse_args()
    from tests.training.tiny_run import make_data

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        results = {name: run_case(name, data_dir, tmp) for name in args.cases.split(",")}
    one = max(max(v) for v in results["one"][0].values()) if "one" in results else None
    print("| case | " + " | ".join(f"{p} MB" for p in PHASES) + " | whole run MB | vs one | save s | load s |")
    print("| --- " * (len(PHASES) + 5) + "|")
    for name, (peaks, seconds) in results.items():
        largest = max(max(v) for v in peaks.values())
        ratio = f"{largest / one:.2f}" if one else "-"
        print(f"| {name} | " + " | ".join(f"{max(peaks[p]):.0f}" for p in PHASES) +
              f" | {largest:.0f} | {ratio} | {seconds['save']:.2f} | {seconds['load']:.2f} |")


if __name__ == "__main__":
    main()
