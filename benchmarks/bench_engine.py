"""Per-op overhead of the autograd engine beside torch's: a tiny op, forward + backward, in µs per op.

    python benchmarks/bench_engine.py [--ops 2000] [--repeats 5]

Builds a chain of N tiny elementwise ops on a 4-element tensor (so arithmetic is negligible and what is
measured is the framework: Function.apply, graph recording, the backward loop), runs backward, and
reports the best of several repeats for infini_train and torch in the same process, and their ratio.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import infini_train as it


def chain_it(n):
    x = it.tensor(np.ones(4, np.float32), requires_grad=True)
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        y = y * 1.0001
    t1 = time.perf_counter()
    y.sum().backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def chain_torch(n):
    import torch

    x = torch.ones(4, requires_grad=True)
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        y = y * 1.0001
    t1 = time.perf_counter()
    y.sum().backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def best(fn, n, repeats):
    runs = [fn(n) for _ in range(repeats)]
    fwd = min(r[0] for r in runs) / n * 1e6
    bwd = min(r[1] for r in runs) / n * 1e6
    return fwd, bwd


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch
        torch.set_num_threads(1)
        has_torch = True
    except ImportError:
        has_torch = False
    f_it, b_it = best(chain_it, args.ops, args.repeats)
    print(f"{'':14s}{'forward µs/op':>15s}{'backward µs/op':>16s}{'total µs/op':>13s}")
    print(f"{'infini_train':14s}{f_it:15.2f}{b_it:16.2f}{f_it + b_it:13.2f}")
    if has_torch:
        f_th, b_th = best(chain_torch, args.ops, args.repeats)
        print(f"{'torch':14s}{f_th:15.2f}{b_th:16.2f}{f_th + b_th:13.2f}")
        print(f"{'ratio it/torch':14s}{f_it / f_th:15.2f}{b_it / b_th:16.2f}{(f_it + b_it) / (f_th + b_th):13.2f}")


if __name__ == "__main__":
    main()
