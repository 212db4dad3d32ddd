"""Learning-rate schedulers against torch.optim.lr_scheduler, and llm.c's cosine-with-warmup formula."""
import math

import pytest
import torch

import infini_train as it
from infini_train import optim
from infini_train.optim import lr_scheduler as S

T = torch.optim.lr_scheduler


def two_group_optimizers():
    ours = optim.SGD([{"params": [it.nn.Parameter(it.ones(1))], "lr": 0.1},
                      {"params": [it.nn.Parameter(it.ones(1))], "lr": 0.02}], lr=0.1)
    theirs = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.ones(1))], "lr": 0.1},
                              {"params": [torch.nn.Parameter(torch.ones(1))], "lr": 0.02}], lr=0.1)
    return ours, theirs


CASES = [
    ("StepLR", lambda o: S.StepLR(o, 3, 0.5), lambda t: T.StepLR(t, 3, 0.5)),
    ("MultiStepLR", lambda o: S.MultiStepLR(o, [7, 2], 0.3), lambda t: T.MultiStepLR(t, [7, 2], 0.3)),
    ("ExponentialLR", lambda o: S.ExponentialLR(o, 0.9), lambda t: T.ExponentialLR(t, 0.9)),
    ("LambdaLR", lambda o: S.LambdaLR(o, lambda e: 1 / (e + 1)), lambda t: T.LambdaLR(t, lambda e: 1 / (e + 1))),
    ("LambdaLR_per_group", lambda o: S.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: e + 1]),
     lambda t: T.LambdaLR(t, [lambda e: 0.9 ** e, lambda e: e + 1])),
    ("ConstantLR", lambda o: S.ConstantLR(o, 0.5, 4), lambda t: T.ConstantLR(t, 0.5, 4)),
    ("LinearLR", lambda o: S.LinearLR(o, 0.2, 1.0, 6), lambda t: T.LinearLR(t, 0.2, 1.0, 6)),
    ("CosineAnnealingLR", lambda o: S.CosineAnnealingLR(o, 10, 0.001), lambda t: T.CosineAnnealingLR(t, 10, 0.001)),
]


@pytest.mark.parametrize("name,ours_fn,torch_fn", CASES, ids=[c[0] for c in CASES])
def test_scheduler_matches_torch(name, ours_fn, torch_fn):
    o, t = two_group_optimizers()
    s, ts = ours_fn(o), torch_fn(t)
    for step in range(25):
        assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-10, abs=1e-15), step
        assert [g["lr"] for g in o.param_groups] == s.get_last_lr()
        o.step()
        t.step()
        s.step()
        ts.step()


def test_scheduler_state_dict_round_trip():
    o, _ = two_group_optimizers()
    s = S.StepLR(o, 3, 0.5)
    for _ in range(5):
        s.step()
    state = s.state_dict()
    assert "optimizer" not in state and state["last_epoch"] == 5
    o2, _ = two_group_optimizers()
    s2 = S.StepLR(o2, 3, 0.5)
    s2.load_state_dict(state)
    assert [g["lr"] for g in o2.param_groups] == s.get_last_lr()
    for _ in range(7):
        s.step()
        s2.step()
        assert s2.get_last_lr() == s.get_last_lr()
    lam = S.LambdaLR(o, lambda e: 0.5)
    assert "lr_lambdas" not in lam.state_dict()


def test_resuming_needs_initial_lr():
    o, _ = two_group_optimizers()
    with pytest.raises(KeyError, match="initial_lr"):
        S.StepLR(o, 3, last_epoch=4)


def llmc_get_lr(it, learning_rate, warmup_iters, num_iterations, learning_rate_decay_frac):
    """The schedule llm.c's GPT-2 training uses, written out as a piecewise function of the iteration:
    (it + 1) / warmup of the peak during warmup, then half a cosine from the peak down to the floor
    peak * decay_frac over the remaining iterations, and the floor afterwards."""
    floor = learning_rate * learning_rate_decay_frac
    warm = it < warmup_iters
    progress = min(max((it - warmup_iters) / max(num_iterations - warmup_iters, 1), 0.0), 1.0)
    decayed = floor + (learning_rate - floor) * (1 + math.cos(math.pi * progress)) / 2
    return learning_rate * (it + 1) / warmup_iters if warm else decayed


@pytest.mark.parametrize("warmup,n,frac", [(10, 100, 0.0), (10, 100, 0.1), (0, 50, 0.0), (700, 18865, 0.0)])
def test_cosine_with_warmup_equals_llmc(warmup, n, frac):
    its = sorted(set(range(0, n + 5, max(1, n // 97))) | {0, warmup - 1, warmup, n - 1, n, n + 1} - {-1})
    for i in its:
        want = llmc_get_lr(i, 6e-4, warmup, n, frac)
        assert S.cosine_with_warmup(i, 6e-4, warmup, n, frac) == pytest.approx(want, rel=1e-12, abs=1e-18)
    assert S.cosine_with_warmup(0, 6e-4, 10, 100) == pytest.approx(6e-5)
    assert S.cosine_with_warmup(55, 6e-4, 10, 100) == pytest.approx(3e-4)


def test_cosine_with_warmup_scheduler_and_plain_function():
    p = it.nn.Parameter(it.ones(1))
    opt = optim.AdamW([{"params": [p]}, {"params": [it.nn.Parameter(it.ones(1))], "lr": 3e-4}], lr=6e-4)
    sched = S.CosineWithWarmup(opt, warmup_iters=10, num_iterations=100, final_lr_frac=0.1)
    for i in range(110):
        assert sched.get_last_lr() == pytest.approx([llmc_get_lr(i, 6e-4, 10, 100, 0.1),
                                                     llmc_get_lr(i, 3e-4, 10, 100, 0.1)], rel=1e-12)
        assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0]
        assert sched.get_lr(i) == sched(i) == pytest.approx(llmc_get_lr(i, 6e-4, 10, 100, 0.1), rel=1e-12)
        sched.step()
    plain = S.CosineWithWarmup(None, 5, 20, max_lr=1e-3)
    assert [plain(i) for i in range(25)] == pytest.approx([llmc_get_lr(i, 1e-3, 5, 20, 0.0) for i in range(25)])
    forced = S.CosineWithWarmup(optim.SGD([p], lr=1.0), 2, 10, max_lr=0.5)
    assert forced.get_last_lr() == [0.25]
    with pytest.raises(ValueError, match="max_lr"):
        S.CosineWithWarmup(None, 5, 20)
