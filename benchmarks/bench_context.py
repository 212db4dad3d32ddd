"""Context parallelism on long sequences: a tiny LLaMA (2 layers, width 128, 4 heads, 2 KV heads by default, byte
vocabulary) trained on one sequence of T tokens per step, split over N context-parallel ranks by each attention
method (ring: keys and values around the ring; ulysses: all-to-all over the heads; hybrid: all-to-all inside groups
of ``--a2a`` ranks, ring across them), optionally beside one process. Each layout runs in its own job, whose ranks
build the run (training.loop.Run) and time its steps, counting every collective and send of each step with the run's
own counters (``dist.count_communication()``): bytes per step and per rank, by collective and by group (an
all-to-all counts its whole input, this rank's own block included; a ring send its tensor). Reports the step time
(the median after the first two steps; with ``--repeats`` the layouts alternate and the median of the runs' medians
is shown with their range), the bytes of the largest rank and its peak resident memory. Nothing here is a test.

    python benchmarks/bench_context.py --length 4096 --ranks 2                   # ring vs ulysses at 4k
    python benchmarks/bench_context.py --length 16384 --ranks 2 --one-process    # and one process, at 16k
    python benchmarks/bench_context.py --length 4096 --ranks 4 --kv-heads 4      # and hybrid (all-to-all 2 x ring 2)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
HEADS = 4
MODEL = ["model.arch=llama3", "model.n_layer=2", "model.n_embd=128", f"model.n_head={HEADS}", "model.vocab_size=257",
         "model.rope_scaling_factor=0"]
METHODS = ("ring", "ulysses", "hybrid")


def overrides(length, ranks, method, a2a, kv_heads, steps, data_dir, out):
    """The run's config (dotted overrides of configs/gpt2_tiny.yaml)."""
    parallel = [f"parallel.context={ranks}"]
    if ranks > 1:
        parallel.append(f"parallel.context_method={method}")
        if method == "hybrid":
            parallel.append(f"parallel.context_a2a={a2a}")
    return [f"out_dir={out}", f"data.train={data_dir}/train_*.bin", "data.val=null", "data.tokenizer=byte",
            f"model.block_size={length}", "train.batch_size=1", f"train.sequence_length={length}",
            f"train.total_batch_size={length}", f"train.num_iterations={steps}", "train.val_loss_every=0",
            "train.sample_every=0", "train.save_every=0", "train.warmup_iters=1", "plot=false", "device=cpu",
            f"model.n_kv_head={kv_heads}", *parallel, *MODEL]


def worker(args):
    """One rank of a layout's job: build the run, time and count each step, write this rank's record."""
    from infini_train import distributed as dist
    from infini_train.training.config import parse_args
    from infini_train.training.loop import Run
    from infini_train.training.step import train_step

    cfg = parse_args(["--config", os.path.join(REPO, "configs", "gpt2_tiny.yaml"),
                      *overrides(args.length, args.ranks, args.method[0], args.a2a, args.kv_heads,
                                args.steps, args.data, args.out)])
    dist.init_process_group("mpi" if args.ranks > 1 else None)
    run = Run(cfg)
    steps = []
    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        with dist.count_communication() as counts:
            train_step(run.step_plan, run.train_loader, cfg.train, step, cfg.seed)
        steps.append({"ms": (time.perf_counter() - t0) * 1000,
                      "rows": [[name, list(ranks), calls, nbytes] for name, ranks, calls, nbytes in counts.rows()]})
    record = {"rank": dist.get_rank(), "steps": steps, "method": run.dims.context_layout,
              "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()


def launch(length, ranks, method, a2a, kv_heads, steps, data_dir, out, threads):
    """Run one layout's job; returns its ranks' records."""
    from tests.distributed.mpi_jobs import MPIEXEC

    os.makedirs(out, exist_ok=True)
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--length", str(length), "--ranks", str(ranks),
            "--method", method, "--a2a", str(a2a), "--kv-heads", str(kv_heads), "--steps", str(steps), "--data",
            data_dir, "--out", out]
    if ranks > 1:
        args = [MPIEXEC, "-n", str(ranks), *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), PYTHONPATH=REPO)
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{method} x {ranks} at T={length} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    records = []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            records.append(json.load(f))
    return records


def summary(records):
    """(median step ms after two steps, {collective: bytes}, {group: bytes}, [(collective, group, calls, bytes)],
    peak MB, the method in words) of the largest rank (the most bytes per step), per step."""
    ms = statistics.median([max(r["steps"][s]["ms"] for r in records) for s in range(2, len(records[0]["steps"]))])
    last = [r["steps"][-1]["rows"] for r in records]  # every step moves the same; the last one is steady
    busiest = max(last, key=lambda rows: sum(row[3] for row in rows))
    by_collective, by_group = {}, {}
    for name, ranks, _, nbytes in busiest:
        by_collective[name] = by_collective.get(name, 0) + nbytes
        by_group[tuple(ranks)] = by_group.get(tuple(ranks), 0) + nbytes
    return ms, by_collective, by_group, busiest, max(r["peak_mb"] for r in records), records[0]["method"]


def splits(method, ranks, a2a, kv_heads):
    """Whether ``method`` can split the model's heads over ``ranks`` context ranks."""
    size = {"ring": 1, "ulysses": ranks, "hybrid": a2a}[method]
    if method == "hybrid" and not (1 < a2a < ranks and ranks % a2a == 0):
        return False
    return HEADS % size == 0 and kv_heads % size == 0


def mb(nbytes):
    return f"{nbytes / 2 ** 20:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--method", nargs="+", default=None, choices=METHODS,
                        help="the methods to compare (default: every one the ranks allow)")
    parser.add_argument("--a2a", type=int, default=2, help="hybrid's all-to-all group size")
    parser.add_argument("--kv-heads", type=int, default=2, help="the model's key/value heads (of 4 query heads)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each layout, alternated")
    parser.add_argument("--one-process", action="store_true", help="also run one process (as many BLAS threads "
                                                                       "as there are ranks)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from tests.training.tiny_run import make_data

    methods = args.method or [m for m in METHODS if splits(m, args.ranks, args.a2a, args.kv_heads)]
    if args.method is None and "ulysses" not in methods:
        print(f"(ulysses needs heads divisible by the {args.ranks} ranks: the model has {args.kv_heads} key/value "
              "heads; --kv-heads 4 lets it run)")
    layouts = [(m, args.ranks, 1) for m in methods] + ([("one process", 1, args.ranks)] if args.one_process else [])
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = make_data(os.path.join(tmp, "data"))
        runs = {}
        for repeat in range(args.repeats):  # alternated, so that a change in the machine's load hits every layout
            for method, ranks, threads in layouts:
                records = launch(args.length, ranks, method if ranks > 1 else "ring", args.a2a, args.kv_heads,
                                 args.steps, data_dir, os.path.join(tmp, f"{method}-{ranks}-{repeat}"), threads)
                runs.setdefault((method, ranks), []).append(summary(records))
        report(args.length, runs)


def report(length, runs):
    """The layouts' table and their collectives' table (markdown)."""
    rows = []
    print(f"| method (T = {length}) | ranks | step ms | MB / step, largest rank: by collective | by group "
          "| peak RSS MB, largest rank |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (method, ranks), results in runs.items():
        times = sorted(r[0] for r in results)
        ms = f"{statistics.median(times):.0f}" + (f" ({times[0]:.0f}-{times[-1]:.0f})" if len(times) > 1 else "")
        _, by_collective, by_group, busiest, peak, name = results[0]
        collectives = ", ".join(f"{k} {mb(v)}" for k, v in by_collective.items()) or "none"
        groups = ", ".join(f"{list(k)} {mb(v)}" for k, v in by_group.items()) or "none"
        print(f"| {name if ranks > 1 else method} | {ranks} | {ms} | {collectives} | {groups} | {peak:.0f} |")
        rows += [(name, *row) for row in busiest] if ranks > 1 else []
    print("\n| method | collective | group | calls / step | MB / step |\n| --- | --- | --- | --- | --- |")
    for name, collective, ranks, calls, nbytes in rows:
        print(f"| {name} | {collective} | {ranks} | {calls} | {mb(nbytes)} |")

if __name__ == "__main__":
    main()
