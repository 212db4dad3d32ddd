"""Run an infini_train optimizer and its torch counterpart side by side on the same small problem."""
import numpy as np
import torch

import infini_train as it


def make_arrays(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32),
            rng.standard_normal(2).astype(np.float32)]  # the last never gets a gradient: optimizers skip it


def loss(params, x):
    """Works for both libraries: a tanh regression, an L2 term and an exp term (ops that exist in both)."""
    w, b, _ = params
    return ((x @ w + b).tanh() ** 2).mean() + (w * w).sum() * 0.01 + b.exp().mean() * 0.1


def build(cls, params, groups=None, **kw):
    if groups:
        return cls([{"params": [params[0]], **groups[0]}, {"params": params[1:], **groups[1]}], **kw)
    return cls(params, **kw)


def run_pair(it_cls, torch_cls, steps=20, groups=None, save_at=None, torch_kw=None, on_step=None, **kw):
    """Train both for ``steps``; at ``save_at`` our optimizer is rebuilt from its state_dict. Checks that
    the parameters agree (rtol 1e-5) after every step; returns both optimizers."""
    arrays = make_arrays()
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    ours = [it.nn.Parameter(it.tensor(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    opt = build(it_cls, ours, groups, **kw)
    topt = build(torch_cls, theirs, groups, foreach=False, **{**kw, **(torch_kw or {})})
    xi, xt = it.tensor(x), torch.tensor(x)
    for step in range(steps):
        if save_at is not None and step == save_at:
            state = opt.state_dict()
            opt = build(it_cls, ours, groups, **kw)
            opt.load_state_dict(state)
        opt.zero_grad()
        loss(ours, xi).backward()
        opt.step()
        topt.zero_grad()
        loss(theirs, xt).backward()
        topt.step()
        if on_step:
            on_step(step, opt, topt)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
    np.testing.assert_array_equal(ours[2].numpy(), arrays[2])
    return opt, topt, ours, theirs
