"""Context parallelism on long sequences: a tiny LLaMA (2 layers, width 128, 4 heads, 2 KV heads, byte vocabulary)
trained on one sequence of T tokens per step, in one process and split over N context-parallel ranks (ring
attention). Reports each layout's median step time (from its metrics.jsonl, after the first steps) and the largest
rank's peak resident memory of the steady state and of the whole run (the run's own per-phase record). Nothing
here is a test.

    python benchmarks/bench_context.py --length 16384 --ranks 4      # memory at 16k
    python benchmarks/bench_context.py --length 4096 --ranks 2        # step time at 4k
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
MODEL = ["model.arch=llama3", "model.n_layer=2", "model.n_embd=128", "model.n_head=4", "model.n_kv_head=2",
         "model.vocab_size=257", "model.rope_scaling_factor=0"]


def run(length, ranks, steps, data_dir, out, threads):
    from tests.distributed.mpi_jobs import MPIEXEC

    args = [sys.executable, os.path.join(REPO, "examples", "gpt2", "train.py"), "--config",
            os.path.join(REPO, "configs", "gpt2_tiny.yaml"), f"out_dir={out}", f"data.train={data_dir}/train_*.bin",
            "data.val=null", "data.tokenizer=byte", f"model.block_size={length}", "train.batch_size=1",
            f"train.sequence_length={length}", f"train.total_batch_size={length}", f"train.num_iterations={steps}",
            "train.val_loss_every=0", "train.sample_every=0", "train.save_every=0", "train.warmup_iters=1",
            "plot=false", "device=cpu", f"parallel.context={ranks}", *MODEL]
    if ranks > 1:
        args = [MPIEXEC, "-n", str(ranks), *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"CP{ranks} at T={length} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    ms = [r["ms"] for r in records if "ms" in r][2:]
    peaks = records[-1]["memory"]["peak_rss_mb"]
    return statistics.median(ms), max(peaks["steady"]), max(max(v) for v in peaks.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    from tests.training.tiny_run import make_data

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        print(f"| layout (T = {args.length}) | step ms | steady MB, largest rank | whole run MB, largest rank |")
        print("| --- | --- | --- | --- |")
        for ranks, threads in ((1, args.ranks), (args.ranks, 1)):  # the same cores either way
            ms, steady, whole = run(args.length, ranks, args.steps, data_dir, os.path.join(tmp, f"cp{ranks}"),
                                    threads)
            name = "one process" if ranks == 1 else f"CP{ranks}"
            print(f"| {name} | {ms:.0f} | {steady:.0f} | {whole:.0f} |", flush=True)


if __name__ == "__main__":
    main()
