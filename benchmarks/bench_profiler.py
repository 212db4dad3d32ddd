"""Profiler overhead: the same work with no profiler and under it.profiler.profile(), beside torch with and without
torch.profiler.profile(), in one run.

    python benchmarks/bench_profiler.py [--ops 2000] [--steps 5] [--repeats 5] [--threads 1]

(a) a chain of N tiny ops (a 4-element multiply, forward and backward: the engine's per-op cost is all there is);
(b) a GPT-2 tiny training step (L4 C256 V512, B4 T64: forward, backward, AdamW), both frameworks on the same
weights (benchmarks/bench_gpt2.py's builders). Reports ops/s or steps/s, best of the repeats, and the ratio
profiled / plain for each framework (1.00 = no overhead). Plain and profiled runs alternate, so drifting machine
load hits both alike.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import infini_train as it  # noqa: E402

TINY = dict(n_layer=4, n_embd=256, n_head=4, vocab_size=512, block_size=64, B=4, T=64)


def chain_it(n):
    x = it.tensor(np.ones(4, np.float32), requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()


def chain_torch(n):
    import torch

    x = torch.ones(4, requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    y.sum().backward()


class _Plain:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def it_profiler():
    return it.profiler.profile()


def torch_profiler():
    import torch

    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])


def timed(work, context, repeats):
    """Best seconds of ``work()`` inside ``context()``: the work only, not the profiler's start and stop (which
    collect and sort the events once, outside the profiled code)."""
    best = float("inf")
    for _ in range(repeats):
        with context():
            t0 = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - t0)
    return best


def compare(work, profiler, repeats):
    """(plain seconds, profiled seconds), alternating."""
    plain, profiled = float("inf"), float("inf")
    for _ in range(repeats):
        plain = min(plain, timed(work, _Plain, 1))
        profiled = min(profiled, timed(work, profiler, 1))
    return plain, profiled


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=3, help="GPT-2 steps per timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from bench_gpt2 import build_it, build_torch

    n = args.ops
    model, it_step = build_it(TINY)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    _, torch_step = build_torch(TINY, state)
    it_step(), torch_step()  # warm-up

    def steps(fn):
        return lambda: [fn() for _ in range(args.steps)]

    rows = []
    # infini_train has 2 ops per link of the chain (Mul forward, MulBackward), as torch does
    for label, work, unit, count in (("tiny-op chain", lambda: chain_it(n), "ops/s", 2 * n),
                                     ("GPT-2 tiny step", steps(it_step), "steps/s", args.steps)):
        plain, prof = compare(work, it_profiler, args.repeats)
        rows.append(("infini_train", label, unit, count / plain, count / prof))
    for label, work, unit, count in (("tiny-op chain", lambda: chain_torch(n), "ops/s", 2 * n),
                                     ("GPT-2 tiny step", steps(torch_step), "steps/s", args.steps)):
        plain, prof = compare(work, torch_profiler, args.repeats)
        rows.append(("torch", label, unit, count / plain, count / prof))
    print(f"{'framework':14s}{'work':18s}{'unit':>9s}{'no profiler':>14s}{'profiled':>12s}{'profiled/plain':>16s}")
    for framework, label, unit, plain, prof in rows:
        print(f"{framework:14s}{label:18s}{unit:>9s}{plain:14.1f}{prof:12.1f}{prof / plain:16.2f}")


if __name__ == "__main__":
    main()
