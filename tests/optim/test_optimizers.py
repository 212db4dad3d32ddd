import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import optim


def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]


def loss_it(ps, x):
    w, b = ps
    return ((x @ w + b).tanh() ** 2).mean() + (w * w).sum() * 0.01


def loss_torch(ps, x):
    w, b = ps
    return ((x @ w + b).tanh() ** 2).mean() + (w * w).sum() * 0.01


def run_pair(it_cls, torch_cls, steps=20, groups=None, save_at=None, **kw):
    arrays = make_params()
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    ours = [it.nn.Parameter(it.tensor(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]

    def build(cls, ps):
        if groups:
            return cls([{"params": [ps[0]], **groups[0]}, {"params": [ps[1]], **groups[1]}], **kw)
        return cls(ps, **kw)

    opt, topt = build(it_cls, ours), build(torch_cls, theirs)
    xi, xt = it.tensor(x), torch.tensor(x)
    for step in range(steps):
        if save_at is not None and step == save_at:
            state = opt.state_dict()
            opt = build(it_cls, ours)
            opt.load_state_dict(state)
        opt.zero_grad()
        loss_it(ours, xi).backward()
        opt.step()
        topt.zero_grad()
        loss_torch(theirs, xt).backward()
        topt.step()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9, nesterov=True),
                                dict(lr=0.05, momentum=0.5, dampening=0.3, weight_decay=0.1)], ids=str)
def test_sgd_matches_torch(kw):
    run_pair(optim.SGD, torch.optim.SGD, **kw)


@pytest.mark.parametrize("cls,tcls", [(optim.Adam, torch.optim.Adam), (optim.AdamW, torch.optim.AdamW)])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_family_matches_torch(cls, tcls, wd):
    run_pair(cls, tcls, lr=0.01, betas=(0.9, 0.95), weight_decay=wd)


def test_param_groups_with_own_lr_and_weight_decay():
    groups = [{"lr": 0.02, "weight_decay": 0.1}, {"lr": 0.005, "weight_decay": 0.0}]
    run_pair(optim.AdamW, torch.optim.AdamW, groups=groups, lr=0.01)


def test_state_dict_round_trip_mid_run_continues_identically():
    run_pair(optim.AdamW, torch.optim.AdamW, save_at=10, lr=0.01, weight_decay=0.1)
    run_pair(optim.SGD, torch.optim.SGD, save_at=10, lr=0.1, momentum=0.9)


def test_optimizer_errors():
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    p = it.nn.Parameter(it.ones(2))
    with pytest.raises(ValueError, match="unknown param group option"):
        optim.SGD([{"params": [p], "lrr": 0.1}], lr=0.1)


def test_schedulers_match_torch():
    def pair(ours_fn, torch_fn, steps=12):
        p = it.nn.Parameter(it.ones(1))
        tp = torch.nn.Parameter(torch.ones(1))
        o, t = optim.SGD([p], lr=0.1), torch.optim.SGD([tp], lr=0.1)
        s, ts = ours_fn(o), torch_fn(t)
        for _ in range(steps):
            assert s.get_last_lr()[0] == pytest.approx(ts.get_last_lr()[0], rel=1e-12)
            o.step()
            t.step()
            s.step()
            ts.step()

    pair(lambda o: optim.lr_scheduler.StepLR(o, 3, 0.5), lambda t: torch.optim.lr_scheduler.StepLR(t, 3, 0.5))
    pair(lambda o: optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (e + 1)),
         lambda t: torch.optim.lr_scheduler.LambdaLR(t, lambda e: 1 / (e + 1)))
    pair(lambda o: optim.lr_scheduler.CosineAnnealingLR(o, 10, 0.01),
         lambda t: torch.optim.lr_scheduler.CosineAnnealingLR(t, 10, 0.01), steps=10)
    pair(lambda o: optim.lr_scheduler.ConstantLR(o, 0.5, 4), lambda t: torch.optim.lr_scheduler.ConstantLR(t, 0.5, 4))


def test_llmc_cosine_with_warmup():
    f = optim.lr_scheduler.cosine_with_warmup
    assert f(0, 6e-4, 10, 100) == pytest.approx(6e-5)
    assert f(9, 6e-4, 10, 100) == pytest.approx(6e-4)
    assert f(55, 6e-4, 10, 100) == pytest.approx(3e-4)
    assert f(100, 6e-4, 10, 100, final_lr_frac=0.1) == pytest.approx(6e-5)
    p = it.nn.Parameter(it.ones(1))
    sched = optim.lr_scheduler.CosineWithWarmup(optim.AdamW([p], lr=6e-4), 10, 100)
    for i in range(30):
        assert sched.get_last_lr()[0] == pytest.approx(f(i, 6e-4, 10, 100))
        sched.step()
