"""Every kernel of the registry (infini_train/kernels/registry.py) against the array path on a GPU, through its Op:
forward and backward with the kernel on and off, the largest difference of any output or gradient (relative to that
result's largest magnitude), whether every result is bit for bit the array path's, and the time of each (median of
--repeats after --warmup). Writes the results table (markdown) to stdout and --out; a kernel that did not take a
case (say a GPU before sm_80) shows why.

    python benchmarks/check_kernels.py [--device cuda:0] [--out kernels.md] [--only flash_attention,...]

This is the table that moves a kernel from CANDIDATE to VERIFIED (with tests/kernels/test_*_cuda.py passing).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import infini_train as it
import infini_train.nn.functional as F
from infini_train.kernels import classifier, flash_attention, gelu_forward, norm_forward, registry


def _normal(shape, dtype, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(getattr(it, dtype))


def attention_case(dtype, b, h, hkv, t, d, dropout_p=0.0):
    arrays = [_normal((b, h, t, d), dtype, 0), _normal((b, hkv, t, d), dtype, 1), _normal((b, hkv, t, d), dtype, 2)]

    def run(device, arrs, grad):
        tensors = [it.tensor(a, device=device, requires_grad=True) for a in arrs]
        it.manual_seed(0)
        out = F.scaled_dot_product_attention(*tensors, is_causal=True, dropout_p=dropout_p, enable_gqa=h != hkv)
        out.backward(grad)
        return [out] + [x.grad for x in tensors]

    def why_not(arrs):
        return flash_attention.why_not(*arrs, dropout_p, 0, True)

    shape = f"B{b} H{h}/{hkv} T{t} D{d} causal" + (f" p={dropout_p}" if dropout_p else "")
    return "flash_attention", dtype, shape, arrays, (b, h, t, d), run, why_not


def classifier_case(dtype, rows, classes):
    arrays = [_normal((rows, classes), dtype, 3, 3.0), np.random.default_rng(4).integers(0, classes, rows)]

    def run(device, arrs, grad):
        logits = it.tensor(arrs[0], device=device, requires_grad=True)
        loss = F.cross_entropy(logits, it.tensor(arrs[1], device=device))
        loss.backward()
        return [loss, logits.grad]

    def why_not(arrs):
        return classifier.why_not(*arrs)

    return "fused_classifier", dtype, f"{rows} x {classes}", arrays, None, run, why_not


def layer_norm_case(dtype, rows, size):
    arrays = [_normal((rows, size), dtype, 5, 2.0), _normal((size,), "float32", 6), _normal((size,), "float32", 7)]

    def run(device, arrs, grad):
        tensors = [it.tensor(a, device=device, requires_grad=True) for a in arrs]
        out = F.layer_norm(tensors[0], (size,), tensors[1], tensors[2])
        out.backward(grad)
        return [out] + [x.grad for x in tensors]

    def why_not(arrs):
        return norm_forward.why_not(arrs[0], arrs[1], arrs[2], size)

    return "layer_norm_forward", dtype, f"{rows} x {size}, f32 weight", arrays, (rows, size), run, why_not


def gelu_case(dtype, rows, size, approximate):
    arrays = [_normal((rows, size), dtype, 8, 3.0)]

    def run(device, arrs, grad):
        x = it.tensor(arrs[0], device=device, requires_grad=True)
        out = F.gelu(x, approximate=approximate)
        out.backward(grad)
        return [out, x.grad]

    def why_not(arrs):
        return gelu_forward.why_not(arrs[0])

    return "gelu_forward", dtype, f"{rows} x {size} {approximate}", arrays, (rows, size), run, why_not


def cases(small=False):
    """GPT-2 124M's shapes (B8 T1024), a grouped-query D128 attention; ``small``: the same cases a few hundred
    times smaller (a smoke test of this script)."""
    n, t, v = (64, 64, 1000) if small else (8192, 1024, 50304)
    return [("flash_attention", attention_case, ("bfloat16", 8, 12, 12, t, 64)),
            ("flash_attention", attention_case, ("float16", 8, 12, 12, t, 64)),
            ("flash_attention", attention_case, ("bfloat16", 8, 12, 12, t, 64, 0.1)),
            ("flash_attention", attention_case, ("bfloat16", 2, 32, 8, 2 * t, 128)),
            ("fused_classifier", classifier_case, ("float32", n, v)),
            ("fused_classifier", classifier_case, ("bfloat16", n, v)),
            ("layer_norm_forward", layer_norm_case, ("bfloat16", n, 768)),
            ("layer_norm_forward", layer_norm_case, ("float32", n, 768)),
            ("gelu_forward", gelu_case, ("bfloat16", n, 3072, "tanh")),
            ("gelu_forward", gelu_case, ("float32", n, 3072, "tanh")),
            ("gelu_forward", gelu_case, ("bfloat16", n, 3072, "none"))]


def _time(fn, sync, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def check(case, device, warmup, repeats):
    name, dtype, shape, arrays, grad_shape, run, why_not = case
    if device.startswith("cuda"):
        import cupy as cp

        dev_arrays, sync = [cp.asarray(a) for a in arrays], cp.cuda.Device().synchronize
    else:  # a dry run of the script: the kernels never take host arrays
        dev_arrays, sync = arrays, (lambda: None)
    grad = None
    if grad_shape is not None:
        grad = it.tensor(_normal(grad_shape, dtype, 9), device=device)
    with registry.selected(name):
        reason = why_not(dev_arrays)
        got = [r.numpy().astype(np.float64) for r in run(device, dev_arrays, grad)]
        kernel_ms = _time(lambda: run(device, dev_arrays, grad), sync, warmup, repeats)
    with registry.selected("none"):
        want = [r.numpy().astype(np.float64) for r in run(device, dev_arrays, grad)]
        array_ms = _time(lambda: run(device, dev_arrays, grad), sync, warmup, repeats)
    errors = [np.abs(a - b).max() / max(np.abs(b).max(), 1e-30) for a, b in zip(got, want)]
    worst = int(np.argmax(errors))
    what = "out" if worst == 0 else f"grad {worst - 1}"
    bitwise = all(np.array_equal(a, b) for a, b in zip(got, want))
    return (f"| {name} | {dtype} | {shape} | {'yes' if reason is None else 'no: ' + reason} | "
            f"{errors[worst]:.2e} ({what}) | {'yes' if bitwise else 'no'} | {array_ms:.2f} | {kernel_ms:.2f} | "
            f"{kernel_ms / array_ms:.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", default=None, help="comma-separated kernel names")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="shapes a few hundred times smaller (a smoke test)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(registry.KERNELS)
    unknown = only - set(registry.KERNELS)
    if unknown:
        parser.error(f"--only: unknown kernels {sorted(unknown)}; the registry's are {sorted(registry.KERNELS)}")
    lines = ["| kernel | dtype | shape | kernel ran | max error vs array path (of max) | bitwise | array ms | "
             "kernel ms | time vs array |", "| --- | --- | --- | --- | ---: | --- | ---: | ---: | ---: |"]
    print("\n".join(lines), flush=True)
    failed = 0
    for name, make, make_args in cases(args.small):
        if name not in only:
            continue
        try:  # the arrays of one case at a time (the classifier's are GBs)
            line = check(make(*make_args), args.device, args.warmup, args.repeats)
        except Exception as exc:  # one kernel's failure is a row of the table, not the end of it
            failed += 1
            line = f"| {name} | {make_args} | error: {type(exc).__name__}: {str(exc)[:160]} | | | | | | |"
        lines.append(line)
        print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
