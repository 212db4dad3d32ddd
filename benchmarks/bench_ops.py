"""Forward + backward time of each GPT-2-relevant op at GPT-2 124M shapes, beside torch, as ratios.

    python benchmarks/bench_ops.py [--T 64 256] [--repeats 5] [--threads 2] [--dtype float32|bfloat16|float16]

Each row builds the same inputs for infini_train and torch, runs forward, then backward with a fixed
upstream gradient, and reports the best of ``repeats`` runs. ratio = infini_train time / torch time
(below 1.0 means infini_train is faster).

``--dtype bfloat16`` (or float16) runs the ops on the inputs mixed precision hands them: the matrix products,
GELU, softmax, attention and layer_norm's input in that dtype; layer_norm's weight and bias, cross_entropy's
logits, the embedding table and one side of the residual add stay float32, as under autocast.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import infini_train as it
import infini_train.nn.functional as F

_FLOAT32_ONLY = {"layer_norm (BT,C)": (False, True, True), "cross_entropy (BT,V)": (True, False),
                 "embedding (V,C)[B,T]": (False, True), "residual add (B,T,C)": (False, True)}


def _time(fn, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def cases(B, T, C=768, V=50257, H=12):
    rng = np.random.default_rng(0)

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ids = rng.integers(0, V, size=(B, T))
    hd = C // H
    return [
        ("linear qkv (BT,C)->(3C)", [f32(B * T, C), f32(3 * C, C, scale=0.02), f32(3 * C)],
         lambda x, w, b: F.linear(x, w, b), lambda torch, x, w, b: torch.nn.functional.linear(x, w, b)),
        ("linear fc (BT,C)->(4C)", [f32(B * T, C), f32(4 * C, C, scale=0.02), f32(4 * C)],
         lambda x, w, b: F.linear(x, w, b), lambda torch, x, w, b: torch.nn.functional.linear(x, w, b)),
        ("lm_head (BT,C)x(V,C)", [f32(B * T, C), f32(V, C, scale=0.02)],
         lambda x, w: F.linear(x, w), lambda torch, x, w: torch.nn.functional.linear(x, w)),
        ("gelu tanh (BT,4C)", [f32(B * T, 4 * C)], lambda x: F.gelu(x, approximate="tanh"),
         lambda torch, x: torch.nn.functional.gelu(x, approximate="tanh")),
        ("layer_norm (BT,C)", [f32(B * T, C), f32(C), f32(C)], lambda x, w, b: F.layer_norm(x, (C,), w, b),
         lambda torch, x, w, b: torch.nn.functional.layer_norm(x, (C,), w, b)),
        ("softmax (B*H*T, T)", [f32(B * H * T, T)], lambda x: F.softmax(x, -1),
         lambda torch, x: torch.softmax(x, -1)),
        ("sdpa causal (B,H,T,hd)", [f32(B, H, T, hd), f32(B, H, T, hd), f32(B, H, T, hd)],
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         lambda torch, q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
        ("cross_entropy (BT,V)", [f32(B * T, V), ids.reshape(-1)], lambda x, t: F.cross_entropy(x, t),
         lambda torch, x, t: torch.nn.functional.cross_entropy(x, t)),
        ("embedding (V,C)[B,T]", [ids, f32(V, C, scale=0.02)], lambda i, w: F.embedding(i, w),
         lambda torch, i, w: torch.nn.functional.embedding(i, w)),
        ("residual add (B,T,C)", [f32(B, T, C), f32(B, T, C)], lambda a, b: a + b, lambda torch, a, b: a + b),
    ]


def in_dtype(name, inputs, dtype):
    """The case's inputs with its floating ones in ``dtype``, except those mixed precision keeps in float32."""
    keep = _FLOAT32_ONLY.get(name, (False,) * len(inputs))
    return [a.astype(dtype) if a.dtype.kind == "f" and not kept else a for a, kept in zip(inputs, keep)]


def run_case(inputs, it_fn, torch_fn, repeats):
    import torch

    def floating(a):
        return a.dtype.kind in "fV"  # V: bfloat16

    # torch.tensor takes no ml_dtypes bfloat16: build each torch input once (through float32), copy it per step
    sources = [torch.tensor(a.astype(np.float32)).to(getattr(torch, a.dtype.name)) if floating(a) else torch.tensor(a)
               for a in inputs]

    def it_step():
        xs = [it.tensor(a, requires_grad=floating(a)) for a in inputs]
        out = it_fn(*xs)
        out.backward(it.ones_like(out))

    def torch_step():
        xs = [t.clone().requires_grad_(t.is_floating_point()) for t in sources]
        out = torch_fn(torch, *xs)
        out.backward(torch.ones_like(out))

    return _time(it_step, repeats), _time(torch_step, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    dtype = it.backend.as_dtype(args.dtype)
    print(f"dtype {args.dtype}")
    print(f"{'op':28s}{'T':>5s}{'infini_train ms':>17s}{'torch ms':>10s}{'ratio':>8s}")
    slower = []
    for T in args.T:
        for name, inputs, it_fn, torch_fn in cases(args.B, T):
            t_it, t_th = run_case(in_dtype(name, inputs, dtype), it_fn, torch_fn, args.repeats)
            ratio = t_it / t_th
            print(f"{name:28s}{T:5d}{t_it * 1e3:17.2f}{t_th * 1e3:10.2f}{ratio:8.2f}")
            if ratio > 1.05:
                slower.append(f"{name} (T={T}): {ratio:.2f}x")
    print("\nslower than torch:", ", ".join(slower) if slower else "none")


if __name__ == "__main__":
    main()
