"""Forward + backward time of the recurrent layers beside torch, as ratios (a sanity check, not a test).

    python benchmarks/bench_rnn.py [--L 64] [--N 32] [--H 256] [--layers 2] [--kinds lstm gru rnn] [--repeats 10]
                                   [--threads 2] [--bidirectional] [--device cuda:0]

Each row builds one layer in torch, loads its state dict into infini_train's, runs forward on the same
(L, N, H) input and backward of output.sum() + h_n.sum(), and reports the best of ``repeats`` runs (the two
alternate, so both see the same machine load).
ratio = infini_train time / torch time (below 1.0 means infini_train is faster). ``--device cuda:0`` runs both
on a GPU (cupy vs torch CUDA, cuDNN for torch).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import infini_train as it

_LAYERS = {"lstm": ("LSTM", {}), "gru": ("GRU", {}), "rnn": ("RNN", {"nonlinearity": "tanh"})}


def _best_of(repeats, *runs):
    """Best time of each (fn, sync) pair, the pairs alternating so that both see the same machine load."""
    best = [float("inf")] * len(runs)
    for fn, _ in runs:
        fn()  # warm-up
    for _ in range(repeats):
        for k, (fn, sync) in enumerate(runs):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def run_case(kind, args, torch):
    cls, extra = _LAYERS[kind]
    torch.manual_seed(0)
    theirs = getattr(torch.nn, cls)(args.H, args.H, num_layers=args.layers, bidirectional=args.bidirectional, **extra)
    ours = getattr(it.nn, cls)(args.H, args.H, num_layers=args.layers, bidirectional=args.bidirectional, **extra)
    ours.load_state_dict({k: it.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
    cuda = args.device.startswith("cuda")
    theirs.to(args.device)
    ours.to(args.device)
    x = np.random.default_rng(0).standard_normal((args.L, args.N, args.H)).astype(np.float32)
    x_it = it.tensor(x, device=args.device)
    x_th = torch.tensor(x, device=args.device)

    def state(out):
        return out[1][0] if kind == "lstm" else out[1]

    def it_step():
        xi = x_it.detach().requires_grad_(True)
        out = ours(xi)
        (out[0].sum() + state(out).sum()).backward()

    def torch_step():
        xt = x_th.detach().requires_grad_(True)
        out = theirs(xt)
        (out[0].sum() + state(out).sum()).backward()

    def sync_it():
        if cuda:
            import cupy

            cupy.cuda.Device().synchronize()

    def sync_torch():
        if cuda:
            torch.cuda.synchronize()

    return _best_of(args.repeats, (it_step, sync_it), (torch_step, sync_torch))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L", type=int, default=64)
    parser.add_argument("--N", type=int, default=32)
    parser.add_argument("--H", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", default=["lstm", "gru", "rnn"], choices=sorted(_LAYERS))
    parser.add_argument("--bidirectional", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"L={args.L} N={args.N} H={args.H} layers={args.layers} bidirectional={args.bidirectional} "
          f"device={args.device}, forward + backward, best of {args.repeats}")
    print(f"{'layer':8s}{'infini_train ms':>17s}{'torch ms':>10s}{'ratio':>8s}")
    for kind in args.kinds:
        t_it, t_th = run_case(kind, args, torch)
        print(f"{kind:8s}{t_it * 1e3:17.1f}{t_th * 1e3:10.1f}{t_it / t_th:8.2f}")


if __name__ == "__main__":
    main()
