"""Drive a GradScaler (ours or torch's) through a scripted sequence of steps and record what it did.

Each step backwards ``scaler.scale(sum_i (p_i * x_i).sum())``, so the gradients are ``scale * x_i``: an x with an
inf or nan gives a non-finite gradient, and a huge x overflows float32 until the scale has backed off enough.
The same script runs on both libraries (they share tensor, *, .sum(), .backward()), so the recorded scales,
skip decisions, gradients and parameters can be compared.
"""
from __future__ import annotations

import numpy as np
import torch

import infini_train as it
from infini_train.amp import GradScaler

SHAPES = [(3, 4), (5,)]


class Recording:
    """An optimizer stand-in that forwards to ``opt`` and returns "stepped" from step, so the scaler's return
    value tells whether the step ran."""

    def __init__(self, opt):
        self.opt = opt
        self.param_groups = opt.param_groups

    def step(self, *args, **kwargs):
        self.opt.step(*args, **kwargs)
        return "stepped"

    def zero_grad(self):
        self.opt.zero_grad()


def initial_params(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def script(n, magnitude=1.0, seed=1, **special):
    """``n`` steps of inputs (one array per parameter); ``special`` maps a kind to the steps it hits:
    inf / neg_inf (one element of parameter 0), nan (one element of parameter 1), huge (all of parameter 0
    set to 3e35, which overflows once multiplied by a scale above 2**10)."""
    rng = np.random.default_rng(seed)
    steps = [[(rng.standard_normal(shape) * magnitude).astype(np.float32) for shape in SHAPES] for _ in range(n)]
    for kind, at in special.items():
        for i in at:
            x0, x1 = steps[i]
            if kind == "inf":
                x0[1, 2] = np.inf
            elif kind == "neg_inf":
                x0[2, 0] = -np.inf
            elif kind == "nan":
                x1[3] = np.nan
            elif kind == "huge":
                x0[...] = 3e35
            else:
                raise ValueError(f"script: unknown special step kind {kind!r}")
    return steps


def lib_of(torch_side):
    return torch if torch_side else it


def make_scaler(torch_side, **kw):
    return torch.amp.GradScaler("cpu", **kw) if torch_side else GradScaler("cpu", **kw)


def make_optimizers(torch_side, params, kind):
    """One optimizer over all params ("sgd", "adamw"), or "split": SGD on params[0] and AdamW on params[1]."""
    optim = torch.optim if torch_side else it.optim
    extra = {"foreach": False} if torch_side else {}
    sgd = dict(lr=0.1, momentum=0.9, weight_decay=0.01, **extra)
    adamw = dict(lr=0.01, weight_decay=0.1, **extra)
    if kind == "sgd":
        return [optim.SGD(params, **sgd)]
    if kind == "adamw":
        return [optim.AdamW(params, **adamw)]
    if kind == "split":
        return [optim.SGD(params[:1], **sgd), optim.AdamW(params[1:], **adamw)]
    raise ValueError(f"make_optimizers: unknown kind {kind!r}")


def to_numpy(t):
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()
    return np.asarray(t.numpy(), dtype=np.float32 if t.dtype == it.bfloat16 else None).copy()


def run(torch_side, steps, scaler_kw=None, opt_kind="sgd", clip=None, dtype="float32", on_step=None, scaler=None):
    """Run ``steps`` and return ``(records, scaler)``; a record per step holds the scale after update, the
    skip decision per optimizer, the gradients after step and the parameters.

    ``clip``: unscale_ every optimizer, then clip_grad_norm_ to this max norm, before stepping.
    ``on_step(i, scaler)``: called before step i; may return a replacement scaler (state_dict round trips)."""
    lib = lib_of(torch_side)
    params = [lib.tensor(a).to(getattr(lib, dtype)).requires_grad_() for a in initial_params()]
    opts = [Recording(o) for o in make_optimizers(torch_side, params, opt_kind)]
    scaler = scaler or make_scaler(torch_side, **(scaler_kw or {}))
    records = []
    for i, xs in enumerate(steps):
        if on_step is not None:
            scaler = on_step(i, scaler) or scaler
        for o in opts:
            o.zero_grad()
        loss = sum((p * lib.tensor(x).to(getattr(lib, dtype))).sum() for p, x in zip(params, xs))
        scaler.scale(loss).backward()
        if clip is not None:
            for o in opts:
                scaler.unscale_(o)
            clip_grad_norm_ = torch.nn.utils.clip_grad_norm_ if torch_side else it.nn.utils.clip_grad_norm_
            clip_grad_norm_(params, clip)
        stepped = [scaler.step(o) == "stepped" for o in opts]
        grads = [to_numpy(p.grad) for p in params]
        scaler.update()
        records.append({"scale": scaler.get_scale(), "stepped": stepped, "grads": grads,
                        "params": [to_numpy(p) for p in params]})
    return records, scaler


def assert_same_run(ours, theirs, rtol=1e-5, atol=1e-6, grads="exact"):
    """Identical scales and skip decisions; parameters close (the optimizers themselves agree with torch to
    rtol 1e-5, see tests/optim); gradients after each step "exact" (bit for bit), "close", or "ignored"."""
    assert [r["scale"] for r in ours] == [r["scale"] for r in theirs]
    assert [r["stepped"] for r in ours] == [r["stepped"] for r in theirs]
    for i, (a, b) in enumerate(zip(ours, theirs)):
        for k, (ga, gb) in enumerate(zip(a["grads"], b["grads"])):
            if grads == "exact":
                np.testing.assert_array_equal(ga, gb, err_msg=f"step {i} grad {k}")
            elif grads == "close":
                np.testing.assert_allclose(ga, gb, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"step {i} grad {k}")
        for k, (pa, pb) in enumerate(zip(a["params"], b["params"])):
            np.testing.assert_allclose(pa, pb, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"step {i} param {k}")
