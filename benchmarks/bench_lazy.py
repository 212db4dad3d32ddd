"""Lazy mode's element-wise fusion: a chain of 8 element-wise ops, eager vs lazy (fused) vs torch eager.

    python benchmarks/bench_lazy.py [--sizes 4194304 16777216] [--repeats 5] [--threads 1]

Times are the best of ``--repeats`` runs in this process (one chain on a float32 tensor without grad, its result
included); peak memory is the growth of the peak RSS (VmHWM, reset once the input exists) during one chain,
measured in a fresh subprocess per framework and size, as bench_gpt2.py does. Lazy results are checked bit for
bit against eager ones.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def chain(x):
    """8 element-wise ops: mul, add, tanh, mul, sub, sigmoid, mul, sqrt."""
    y = x * 1.5 + 0.5
    y = y.tanh() * x
    y = y - 0.25
    y = y.sigmoid()
    y = y * y
    return y.sqrt()


def _status_mb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux >= 4.0), so that set-up transients do not hide the chain's peak."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _input(n):
    return np.random.default_rng(0).standard_normal(n).astype(np.float32)


def runner(framework, n):
    """A function computing the chain once (returning a host array), for framework eager | lazy | torch."""
    if framework == "torch":
        import torch
        x = torch.from_numpy(_input(n))
        return lambda: chain(x).numpy()
    import infini_train as it
    x = it.tensor(_input(n))
    if framework == "eager":
        return lambda: chain(x).numpy()

    def lazy():
        with it.lazy():
            return chain(x).numpy()

    return lazy


def memory_child(framework, n, threads):
    import torch
    torch.set_num_threads(threads)
    run = runner(framework, n)
    reset_peak_rss()
    base = _status_mb("VmRSS:")
    run()
    return _status_mb("VmHWM:") - base


def memory_probe(framework, n, threads):
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import benchmarks.bench_lazy as b; "
            f"print(b.memory_child({framework!r}, {n}, {threads}))")
    # every large array its own mapping, returned to the system when freed: infini_train's tuned heap
    # (backend.tune_host_allocator) and glibc's sliding threshold would serve arrays from pages freed earlier
    # (the input's set-up), and RSS would not see them
    env = dict(os.environ, INFINI_TRAIN_TUNE_MALLOC="0", MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else float("nan")


def best_ms(run, repeats):
    run()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1 << 22, 1 << 24])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (numpy uses one)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    import infini_train as it

    print(f"{'elements':>10} {'framework':>10} {'time ms':>9} {'peak MB':>9}")
    for n in args.sizes:
        eager_out = runner("eager", n)()
        lazy_out = runner("lazy", n)()
        assert eager_out.tobytes() == lazy_out.tobytes(), "lazy result differs from eager"
        it.lazy.reset_fusion_stats()
        runner("lazy", n)()
        fused = it.lazy.fusion_stats()
        for framework in ("eager", "lazy", "torch"):
            ms = best_ms(runner(framework, n), args.repeats)
            mb = memory_probe(framework, n, args.threads)
            print(f"{n:>10} {framework:>10} {ms:>9.1f} {mb:>9.1f}")
        print(f"{'':>10} lazy: {fused['groups']} fused group of {fused['fused_nodes']} ops in {fused['blocks']} blocks")


if __name__ == "__main__":
    main()
