"""Step time of ZeRO-3 (fully_shard) against ZeRO-2 on the same ranks: whole training runs alternated A B A B ...,
each run's median step time after its first steps read from its metrics.jsonl, and the ratio ZeRO-3 / ZeRO-2 of each
pair (the machine's drift cancels within a pair). Nothing here is a test.

    python benchmarks/bench_zero.py                        # GPT-2 124M shapes (byte vocabulary), B4 T64, 2 ranks
    python benchmarks/bench_zero.py --model tiny --pairs 5 # the 4-layer default model, B8 T64
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MODELS = {
    "124m": ("gpt2_124m.yaml", ["model.vocab_size=257", "model.block_size=64", "train.batch_size=4",
                                "train.sequence_length=64", "train.total_batch_size=512", "train.num_iterations=7"], 2),
    "tiny": ("gpt2_tiny.yaml", ["train.batch_size=8", "train.total_batch_size=1024", "train.num_iterations=24"], 4),
}


def step_ms(model, stage, ranks, data_dir, out):
    from tests.distributed.mpi_jobs import MPIEXEC

    config, overrides, skip = MODELS[model]
    args = [MPIEXEC, "-n", str(ranks), sys.executable, os.path.join(REPO, "examples", "gpt2", "train.py"), "--config",
            os.path.join(REPO, "configs", config), f"out_dir={out}", f"data.train={data_dir}/train_*.bin",
            "data.val=null", "data.tokenizer=byte", "train.val_loss_every=0", "train.sample_every=0",
            "train.warmup_iters=1", "train.save_every=0", "plot=false", "device=cpu", f"parallel.zero_stage={stage}",
            *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"ZeRO-{stage} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        ms = [json.loads(line)["ms"] for line in f if '"ms"' in line]
    return statistics.median(ms[skip:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="124m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    from tests.training.tiny_run import make_data

    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        for pair in range(args.pairs):
            ms = {stage: step_ms(args.model, stage, args.ranks, data_dir, os.path.join(tmp, f"run{pair}-{stage}"))
                  for stage in (2, 3)}
            ratios.append(ms[3] / ms[2])
            print(f"pair {pair + 1}: ZeRO-2 {ms[2]:.1f} ms, ZeRO-3 {ms[3]:.1f} ms, ratio {ratios[-1]:.3f}", flush=True)
    print(f"ZeRO-3 / ZeRO-2 step time: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {len(ratios)} pairs")


if __name__ == "__main__":
    main()
