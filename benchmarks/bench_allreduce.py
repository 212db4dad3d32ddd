"""All-reduce bus bandwidth: infini_train's dist.all_reduce beside raw mpi4py Allreduce on the same buffers.

    mpiexec -n 2 python benchmarks/bench_allreduce.py [--min-bytes 1K] [--max-bytes 64M] [--repeats 5]

For each size (powers of 4 from --min-bytes to --max-bytes) both run on the same float32 buffer, in
alternating order, several repeats of a batch of calls; the best repeat counts, with each repeat's time taken
as the slowest rank's. Bus bandwidth follows nccl-tests: bytes / time * 2 (n - 1) / n, what each rank's link
carries. ratio = raw time / our time (1.0: no overhead; target >= 0.9). Sync calls are what is measured: our
all_reduce starts an Iallreduce and waits on it (that is how the collective timeout works).

Then the DDP step overhead: the same training step with and without DistributedDataParallel.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.backend import CPU

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text):
    text = text.strip().upper().rstrip("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def human(nbytes):
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit]:
            return f"{nbytes / _UNITS[unit]:g} {unit}B"
    return f"{nbytes} B"


def slowest(comm, MPI, seconds):
    value = np.array([seconds])
    comm.Allreduce(MPI.IN_PLACE, value, op=MPI.MAX)
    return float(value[0])


def time_batch(comm, MPI, fn, calls):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return slowest(comm, MPI, time.perf_counter() - t0) / calls


def measure_size(comm, MPI, nbytes, repeats, dtype):
    buf = np.zeros(max(1, nbytes // np.dtype(dtype).itemsize), dtype)  # zeros: the sums never overflow
    tensor = it.Tensor._make(buf, CPU)

    def raw():
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def ours():
        dist.all_reduce(tensor)

    calls = int(min(2000, max(3, (16 << 20) // max(nbytes, 1))))  # ~16 MB moved per batch
    for fn in (raw, ours):  # warm-up: first touches, MPI's internal buffers
        fn()
    best = {"raw": float("inf"), "ours": float("inf")}
    for r in range(repeats):
        order = (("raw", raw), ("ours", ours)) if r % 2 == 0 else (("ours", ours), ("raw", raw))
        for name, fn in order:
            best[name] = min(best[name], time_batch(comm, MPI, fn, calls))
    return buf.nbytes, best["raw"], best["ours"]


def measure_ddp_step_overhead(comm, args, steps=6):
    """One training step (forward + backward + AdamW) of the tiny GPT-2 on the same local batch, with and
    without the DistributedDataParallel wrapper, alternating; the best step of each counts (slowest rank)."""
    from mpi4py import MPI

    from infini_train.models.gpt2 import GPT2, GPT2Config
    from infini_train.nn.parallel import DistributedDataParallel

    cfg = GPT2Config(block_size=64, vocab_size=512, n_layer=4, n_head=4, n_embd=256)
    rng = np.random.default_rng(comm.Get_rank())
    x = it.tensor(rng.integers(0, 512, (8, 64)))
    y = it.tensor(rng.integers(0, 512, (8, 64)))

    def stepper(wrap):
        it.manual_seed(0)
        model = GPT2(cfg)
        runner = DistributedDataParallel(model) if wrap else model
        opt = model.configure_optimizers(0.1, 1e-4)

        def step():
            opt.zero_grad()
            _, loss = runner(x, y)
            loss.backward()
            opt.step()
        return step

    plain, ddp = stepper(False), stepper(True)
    plain(), ddp()
    t_plain, t_ddp = [], []
    for _ in range(steps):
        t_plain.append(slowest(comm, MPI, _timed(plain)))
        t_ddp.append(slowest(comm, MPI, _timed(ddp)))
    best_plain, best_ddp = min(t_plain), min(t_ddp)
    grad_mb = sum(p.numel() for p in GPT2(cfg).parameters()) * 4 / 2 ** 20
    return [("model", f"GPT-2 L4 C256 ({grad_mb:.1f} MB of gradients), local batch 8x64"),
            ("step without DDP", f"{best_plain * 1e3:.1f} ms"), ("step with DDP", f"{best_ddp * 1e3:.1f} ms"),
            ("DDP step overhead", f"{100 * (best_ddp - best_plain) / best_plain:.1f}% (target <= 10%)")]


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", default="1K", help="smallest message (e.g. 1K, 256K, 4M)")
    parser.add_argument("--max-bytes", default="64M", help="largest message")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per size (the best counts)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file (rank 0)")
    args = parser.parse_args()

    from mpi4py import MPI

    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if world < 2 and rank == 0:
        print("note: a world of 1 rank; run under mpiexec -n 2 (or more) to measure communication")
    bus = 2 * (world - 1) / world if world > 1 else 1.0
    sizes = []
    size = parse_bytes(args.min_bytes)
    while size <= parse_bytes(args.max_bytes):
        sizes.append(size)
        size *= 4
    rows = []
    if rank == 0:
        print(f"all_reduce SUM {args.dtype}, {world} ranks, MPI: {MPI.Get_library_version().splitlines()[0]}")
        print(f"{'size':>8} | {'raw MPI µs':>11} {'busbw GB/s':>10} | {'ours µs':>11} {'busbw GB/s':>10} | "
              f"{'ratio':>5}")
    for nbytes in sizes:
        nbytes, raw_s, ours_s = measure_size(comm, MPI, nbytes, args.repeats, np.dtype(args.dtype))
        row = {"bytes": nbytes, "raw_us": raw_s * 1e6, "ours_us": ours_s * 1e6,
               "raw_busbw_GBs": nbytes / raw_s * bus / 1e9, "ours_busbw_GBs": nbytes / ours_s * bus / 1e9,
               "ratio": raw_s / ours_s}
        rows.append(row)
        if rank == 0:
            print(f"{human(nbytes):>8} | {row['raw_us']:11.1f} {row['raw_busbw_GBs']:10.3f} | {row['ours_us']:11.1f} "
                  f"{row['ours_busbw_GBs']:10.3f} | {row['ratio']:5.2f}", flush=True)
    if rank == 0:
        large = [r["ratio"] for r in rows if r["bytes"] >= 256 << 10]
        geo = float(np.exp(np.mean(np.log([r["ratio"] for r in rows]))))
        print(f"ratio geometric mean {geo:.2f}" + (f", min over >= 256 KB {min(large):.2f}" if large else "")
              + " (target >= 0.9)")
    ddp = measure_ddp_step_overhead(comm, args)
    if rank == 0:
        if ddp is None:
            print("DDP step overhead: not measured yet (see measure_ddp_step_overhead)")
        else:
            for label, value in ddp:
                print(f"{label}: {value}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world": world, "dtype": args.dtype, "allreduce": rows, "ddp": ddp}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
