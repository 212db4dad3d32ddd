"""Forward + backward time of conv2d, max_pool2d, avg_pool2d and batch_norm at CIFAR-like shapes, beside torch.

    python benchmarks/bench_conv.py [--B 32] [--repeats 5] [--threads 2]

Each row runs forward, then backward with a ones upstream gradient, for the same inputs in infini_train and
torch, and reports the best of ``repeats`` runs. ratio = infini_train time / torch time (below 1.0: faster).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import infini_train.nn.functional as F  # noqa: E402
from bench_ops import run_case  # noqa: E402


def cases(B):
    rng = np.random.default_rng(0)

    def f32(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return [
        ("conv 3->64 3x3 p1 (B,3,32,32)", [f32(B, 3, 32, 32), f32(64, 3, 3, 3, scale=0.2), f32(64)],
         lambda x, w, b: F.conv2d(x, w, b, padding=1),
         lambda torch, x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1)),
        ("conv 64->64 3x3 p1 (B,64,32,32)", [f32(B, 64, 32, 32), f32(64, 64, 3, 3, scale=0.05), f32(64)],
         lambda x, w, b: F.conv2d(x, w, b, padding=1),
         lambda torch, x, w, b: torch.nn.functional.conv2d(x, w, b, padding=1)),
        ("conv 64->128 3x3 s2 (B,64,32,32)", [f32(B, 64, 32, 32), f32(128, 64, 3, 3, scale=0.05), f32(128)],
         lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
         lambda torch, x, w, b: torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)),
        ("depthwise 64 3x3 (B,64,32,32)", [f32(B, 64, 32, 32), f32(64, 1, 3, 3, scale=0.3)],
         lambda x, w: F.conv2d(x, w, padding=1, groups=64),
         lambda torch, x, w: torch.nn.functional.conv2d(x, w, padding=1, groups=64)),
        ("max_pool 2x2 (B,64,32,32)", [f32(B, 64, 32, 32)], lambda x: F.max_pool2d(x, 2),
         lambda torch, x: torch.nn.functional.max_pool2d(x, 2)),
        ("max_pool 3x3 s2 p1 (B,64,32,32)", [f32(B, 64, 32, 32)], lambda x: F.max_pool2d(x, 3, 2, 1),
         lambda torch, x: torch.nn.functional.max_pool2d(x, 3, 2, 1)),
        ("avg_pool 2x2 (B,64,32,32)", [f32(B, 64, 32, 32)], lambda x: F.avg_pool2d(x, 2),
         lambda torch, x: torch.nn.functional.avg_pool2d(x, 2)),
        ("batch_norm train (B,64,32,32)", [f32(B, 64, 32, 32), f32(64), f32(64)],
         lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
         lambda torch, x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, training=True)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"{'op (forward + backward)':34s}{'infini_train ms':>17s}{'torch ms':>10s}{'ratio':>8s}")
    for name, inputs, it_fn, torch_fn in cases(args.B):
        t_it, t_th = run_case(inputs, it_fn, torch_fn, args.repeats)
        print(f"{name:34s}{t_it * 1e3:17.2f}{t_th * 1e3:10.2f}{t_it / t_th:8.2f}")


if __name__ == "__main__":
    main()
