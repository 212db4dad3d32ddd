"""Attention forward + backward against sequence length: the materialised path, the memory-efficient blocked path
(FlashAttention-2) and torch's scaled_dot_product_attention, side by side. Causal, B1, 4 heads, D 64, float32.

Each (path, T) runs in a child process: time is the median of 3 forward+backward passes after one warm-up, memory
the growth of the process's peak resident set over what the inputs took (the same measure for all three). The
materialised path is skipped where its (T, T) probabilities alone would pass --max-mb. Nothing here is a test.

    python benchmarks/bench_attention.py
    python benchmarks/bench_attention.py --lengths 512,1024,2048 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADS, DIM = 4, 64

CHILD = r"""
import json, resource, statistics, sys, time
import numpy as np
path, T, heads, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
arrays = [rng.standard_normal((1, heads, T, dim)).astype(np.float32) for _ in range(4)]
if path == "torch":
    import torch
    F = torch.nn.functional
    def run():
        q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(torch.tensor(arrays[3]))
else:
    sys.path.insert(0, sys.argv[5])
    import infini_train as it
    from infini_train.nn.attention import SDPBackend, sdpa_kernel
    backend = SDPBackend.MATH if path == "math" else SDPBackend.FLASH_ATTENTION
    def run():
        q, k, v = (it.tensor(a, requires_grad=True) for a in arrays[:3])
        with sdpa_kernel(backend):
            out = it.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(it.tensor(arrays[3]))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run()
times = []
for _ in range(3):
    t0 = time.perf_counter(); run(); times.append(time.perf_counter() - t0)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ms": statistics.median(times) * 1e3, "mb": (peak - base) / 1024}))
"""


def measure(path, T, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", CHILD, path, str(T), str(HEADS), str(DIM), REPO],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{path} at T={T} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-mb", type=float, default=3000, help="skip the materialised path above this")
    args = parser.parse_args()
    print("| T | materialised ms | blocked ms | torch ms | blocked / torch | materialised MB | blocked MB | torch MB |")
    print("| --- " * 8 + "|")
    for T in (int(t) for t in args.lengths.split(",")):
        results = {}
        for path in ("math", "blocked", "torch"):
            if path == "math" and HEADS * T * T * 4 / 2 ** 20 > args.max_mb:
                results[path] = None
                continue
            results[path] = measure(path, T, args.threads)
        m, b, t = results["math"], results["blocked"], results["torch"]
        cell = (lambda r, k: f"{r[k]:.0f}" if r else "-")
        print(f"| {T} | {cell(m, 'ms')} | {cell(b, 'ms')} | {cell(t, 'ms')} | {b['ms'] / t['ms']:.2f} | "
              f"{cell(m, 'mb')} | {cell(b, 'mb')} | {cell(t, 'mb')} |", flush=True)


if __name__ == "__main__":
    main()
