"""Learning-rate schedulers against torch.optim.lr_scheduler, and llm.c's cosine-with-warmup formula."""
import math
import warnings

import numpy as np
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


# ------------------------------------------------------------------ LinearLR, OneCycleLR, warm restarts, sequences
def momentum_of(group):
    return group["betas"][0] if "betas" in group else group["momentum"]


def optimizer_pair(kind, lrs=(0.1, 0.02)):
    """Our optimizer and torch's with the same two param groups; kind "sgd" (momentum), "adam" or "adamw"."""
    cls, tcls, kw = {"sgd": (optim.SGD, torch.optim.SGD, dict(momentum=0.9)),
                     "adam": (optim.Adam, torch.optim.Adam, dict(betas=(0.8, 0.99))),
                     "adamw": (optim.AdamW, torch.optim.AdamW, dict())}[kind]
    ours = cls([{"params": [it.nn.Parameter(it.ones(1))], "lr": lr} for lr in lrs], lr=lrs[0], **kw)
    theirs = tcls([{"params": [torch.nn.Parameter(torch.ones(1))], "lr": lr} for lr in lrs], lr=lrs[0], **kw)
    return ours, theirs


def assert_same_lrs(s, ts, o, t, step):
    """lrs (get_last_lr and the groups') and momenta equal torch's to rel 1e-12."""
    assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-18), step
    assert [g["lr"] for g in o.param_groups] == s.get_last_lr(), step
    for g, tg in zip(o.param_groups, t.param_groups):
        assert momentum_of(g) == pytest.approx(momentum_of(tg), rel=1e-12), step


def run_schedules(s, ts, o, t, steps):
    for step in range(steps):
        assert_same_lrs(s, ts, o, t, step)
        o.step()
        t.step()
        s.step()
        ts.step()
    assert_same_lrs(s, ts, o, t, steps)


NEW_CASES = [
    ("LinearLR_decay", "sgd", 30, lambda o, S: S.LinearLR(o, 1.0, 0.05, 12)),
    ("LinearLR_to_zero", "sgd", 30, lambda o, S: S.LinearLR(o, 0.5, 0.0, 7)),
    ("LinearLR_no_iters", "sgd", 8, lambda o, S: S.LinearLR(o, 0.25, 1.0, 0)),  # torch stays at start_factor
    ("OneCycle_cos_sgd", "sgd", 100, lambda o, S: S.OneCycleLR(o, 1.0, total_steps=100)),
    ("OneCycle_linear_adam", "adam", 57, lambda o, S: S.OneCycleLR(o, [0.3, 0.7], total_steps=57, pct_start=0.25,
                                                                  anneal_strategy="linear")),
    ("OneCycle_three_phase_adamw", "adamw", 60, lambda o, S: S.OneCycleLR(
        o, 0.5, epochs=6, steps_per_epoch=10, three_phase=True, base_momentum=[0.8, 0.7], max_momentum=(0.99, 0.9),
        div_factor=10.0, final_div_factor=100.0)),
    ("OneCycle_no_momentum", "sgd", 40, lambda o, S: S.OneCycleLR(o, 2.0, total_steps=40, cycle_momentum=False)),
    ("WarmRestarts", "sgd", 50, lambda o, S: S.CosineAnnealingWarmRestarts(o, 7, eta_min=0.001)),
    ("WarmRestarts_T_mult", "adamw", 80, lambda o, S: S.CosineAnnealingWarmRestarts(o, 3, T_mult=2)),
    ("Sequential_warmup_cosine", "sgd", 40, lambda o, S: S.SequentialLR(
        o, [S.LinearLR(o, 0.1, 1.0, 5), S.CosineAnnealingLR(o, 20, 0.001)], milestones=[5])),
    ("Sequential_three", "adam", 45, lambda o, S: S.SequentialLR(
        o, [S.ConstantLR(o, 0.1, 4), S.ExponentialLR(o, 0.9), S.CosineAnnealingWarmRestarts(o, 4, 2)], [4, 9])),
    ("Sequential_onecycle_then_constant", "sgd", 30, lambda o, S: S.SequentialLR(
        o, [S.OneCycleLR(o, 1.0, total_steps=12), S.ConstantLR(o, 0.5, 100)], [12])),
]


@pytest.mark.parametrize("name,kind,steps,make", NEW_CASES, ids=[c[0] for c in NEW_CASES])
def test_new_schedulers_match_torch(name, kind, steps, make):
    o, t = optimizer_pair(kind)
    s, ts = make(o, S), make(t, T)
    run_schedules(s, ts, o, t, steps)


@pytest.mark.parametrize("name,kind,steps,make", NEW_CASES, ids=[c[0] for c in NEW_CASES])
def test_new_schedulers_resume_from_state_dict(name, kind, steps, make):
    """Halfway, a fresh optimizer and scheduler load both state_dicts and continue torch's sequence."""
    o, t = optimizer_pair(kind)
    s, ts = make(o, S), make(t, T)
    half = steps // 2
    for _ in range(half):
        o.step()
        t.step()
        s.step()
        ts.step()
    opt_state, sched_state = o.state_dict(), s.state_dict()
    assert "optimizer" not in sched_state and sched_state["last_epoch"] == half
    o2, _ = optimizer_pair(kind, lrs=(0.7, 0.3))
    s2 = make(o2, S)
    o2.load_state_dict(opt_state)
    s2.load_state_dict(sched_state)
    run_schedules(s2, ts, o2, t, steps - half)


def test_scheduler_state_dict_alone_restores_lrs_and_momenta():
    """Without the optimizer's state, loading the scheduler's still leaves the groups at the resumed step."""
    o, t = optimizer_pair("adam")
    s, ts = S.OneCycleLR(o, 1.0, total_steps=20), T.OneCycleLR(t, 1.0, total_steps=20)
    for _ in range(7):
        o.step()
        t.step()
        s.step()
        ts.step()
    o2, _ = optimizer_pair("adam")
    s2 = S.OneCycleLR(o2, 1.0, total_steps=20)
    s2.load_state_dict(s.state_dict())
    run_schedules(s2, ts, o2, t, 13)


def test_one_cycle_momentum_drives_training_like_torch():
    """OneCycleLR's lr and momentum reach the update: parameters follow torch's over a whole cycle."""
    from tests.optim.trajectory import loss, make_arrays

    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    for cls, tcls, kw in [(optim.SGD, torch.optim.SGD, dict(momentum=0.5, nesterov=True)),
                          (optim.AdamW, torch.optim.AdamW, dict(weight_decay=0.1))]:
        ours = [it.nn.Parameter(it.tensor(a)) for a in make_arrays()]
        theirs = [torch.nn.Parameter(torch.tensor(a)) for a in make_arrays()]
        opt, topt = cls(ours, lr=0.1, **kw), tcls(theirs, lr=0.1, foreach=False, **kw)
        s, ts = S.OneCycleLR(opt, 0.05, total_steps=25), T.OneCycleLR(topt, 0.05, total_steps=25)
        for step in range(24):  # the last step of the cycle: momentum is back at max_momentum
            for o, ps, xx in ((opt, ours, it.tensor(x)), (topt, theirs, torch.tensor(x))):
                o.zero_grad()
                loss(ps, xx).backward()
                o.step()
            s.step()
            ts.step()
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=str(step))
        assert momentum_of(opt.param_groups[0]) == momentum_of(topt.param_groups[0]) == 0.95


def test_warm_restarts_fractional_and_jumping_epochs_match_torch():
    for t_mult in (1, 2, 3):
        o, t = optimizer_pair("sgd")
        s = S.CosineAnnealingWarmRestarts(o, 4, T_mult=t_mult, eta_min=0.01)
        ts = T.CosineAnnealingWarmRestarts(t, 4, T_mult=t_mult, eta_min=0.01)
        epochs = [0.0, 0.25, 1.5, 3.99, 4.0, 4.5, 11.75, 12.0, 27.3, 2, 40, 7.125, 100.5]
        epochs += [e + i / 8 for e in range(20) for i in range(8)]
        for epoch in epochs:
            o.step()
            t.step()
            s.step(epoch)
            ts.step(epoch)
            assert_same_lrs(s, ts, o, t, epoch)
            assert (s.last_epoch, s.T_i) == (ts.last_epoch, ts.T_i) and s.T_cur == pytest.approx(ts.T_cur, rel=1e-12)
        for _ in range(10):  # plain steps continue from the jumped-to epoch
            s.step()
            ts.step()
            assert_same_lrs(s, ts, o, t, "after jumps")
        with pytest.raises(ValueError, match="non-negative epoch"):
            s.step(-1)


def test_linear_lr_step_epoch_matches_torch_closed_form():
    o, t = optimizer_pair("sgd")
    s, ts = S.LinearLR(o, 0.2, 0.9, 10), T.LinearLR(t, 0.2, 0.9, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates step(epoch)
        for epoch in (3, 0, 12, 7, 10):
            o.step()
            t.step()
            s.step(epoch)
            ts.step(epoch)
            assert_same_lrs(s, ts, o, t, epoch)


def torch_and_ours_raise(build, exc, match):
    """``build(S, optimizers)`` raises ``exc`` in torch and ours; ours names the problem (``match``)."""
    o, t = optimizer_pair("sgd")
    with pytest.raises(exc):
        build(T, t)
    with pytest.raises(exc, match=match):
        build(S, o)


ERRORS = [
    (lambda L, o: L.LinearLR(o, start_factor=0), ValueError, "start_factor"),
    (lambda L, o: L.LinearLR(o, start_factor=1.5), ValueError, "start_factor"),
    (lambda L, o: L.LinearLR(o, end_factor=-0.1), ValueError, "end_factor"),
    (lambda L, o: L.LinearLR(o, end_factor=1.1), ValueError, "end_factor"),
    (lambda L, o: L.OneCycleLR(o, 1.0), ValueError, "total_steps OR"),
    (lambda L, o: L.OneCycleLR(o, 1.0, epochs=3), ValueError, "total_steps OR"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=0), ValueError, "total_steps"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=2.5), ValueError, "total_steps"),
    (lambda L, o: L.OneCycleLR(o, 1.0, epochs=0, steps_per_epoch=3), ValueError, "epochs"),
    (lambda L, o: L.OneCycleLR(o, 1.0, epochs=2, steps_per_epoch=-3), ValueError, "steps_per_epoch"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=10, pct_start=1.5), ValueError, "pct_start"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=10, pct_start=1), ValueError, "pct_start"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=10, anneal_strategy="exp"), ValueError, "anneal_strategy"),
    (lambda L, o: L.OneCycleLR(o, [1.0, 2.0, 3.0], total_steps=10), ValueError, "max_lr.*3 values"),
    (lambda L, o: L.OneCycleLR(o, 1.0, total_steps=10, max_momentum=[0.9]), ValueError, "max_momentum"),
    (lambda L, o: L.OneCycleLR("sgd", 1.0, total_steps=10), TypeError, "Optimizer"),
    (lambda L, o: L.CosineAnnealingWarmRestarts(o, 0), ValueError, "T_0"),
    (lambda L, o: L.CosineAnnealingWarmRestarts(o, 2.5), ValueError, "T_0"),
    (lambda L, o: L.CosineAnnealingWarmRestarts(o, 3, T_mult=0), ValueError, "T_mult"),
    (lambda L, o: L.CosineAnnealingWarmRestarts(o, 3, T_mult=1.5), ValueError, "T_mult"),
    (lambda L, o: L.CosineAnnealingWarmRestarts(o, 3, eta_min="0"), ValueError, "eta_min"),
    (lambda L, o: L.SequentialLR(o, [], []), ValueError, "at least one scheduler"),
    (lambda L, o: L.SequentialLR(o, [L.StepLR(o, 2), L.StepLR(o, 3)], []), ValueError, "one milestone fewer"),
    (lambda L, o: L.SequentialLR(o, [L.StepLR(o, 2), L.StepLR(o, 3)], [2, 4]), ValueError, "one milestone fewer"),
    (lambda L, o: L.SequentialLR(o, [L.StepLR(o, 2), "cosine"], [2]), TypeError, r"schedulers\[1\]"),
]


@pytest.mark.parametrize("build,exc,match", ERRORS, ids=range(len(ERRORS)))
def test_invalid_arguments_raise_like_torch(build, exc, match):
    torch_and_ours_raise(build, exc, match)


def test_other_invalid_uses_raise_like_torch():
    o, t = optimizer_pair("sgd")
    o2, t2 = optimizer_pair("sgd")
    with pytest.raises(ValueError):
        T.SequentialLR(t, [T.StepLR(t, 2), T.StepLR(t2, 3)], [2])
    with pytest.raises(ValueError, match="same optimizer"):
        S.SequentialLR(o, [S.StepLR(o, 2), S.StepLR(o2, 3)], [2])
    plain, tplain = optim.Optimizer([it.nn.Parameter(it.ones(1))], dict(lr=0.1)), torch.optim.Optimizer(
        [torch.nn.Parameter(torch.ones(1))], dict(lr=0.1))
    with pytest.raises(ValueError):
        T.OneCycleLR(tplain, 1.0, total_steps=5)
    with pytest.raises(ValueError, match="cycle_momentum"):
        S.OneCycleLR(plain, 1.0, total_steps=5)
    S.OneCycleLR(plain, 1.0, total_steps=5, cycle_momentum=False)  # fine without momentum cycling
    s, ts = S.OneCycleLR(o, 1.0, total_steps=5), T.OneCycleLR(t, 1.0, total_steps=5)
    for _ in range(5):  # step total_steps is still allowed (torch extrapolates one step past the end)
        o.step()
        t.step()
        s.step()
        ts.step()
    assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
    with pytest.raises(ValueError):
        ts.step()
    with pytest.raises(ValueError, match="tried to step 6 times"):
        s.step()
