"""Schedulers that compose as torch's do: several chainable schedulers on one optimizer (torch's documented chaining,
e.g. ExponentialLR then MultiStepLR) multiply their factors into the current lr; ChainedScheduler; the new
MultiplicativeLR, PolynomialLR and ReduceLROnPlateau. Every sequence, get_last_lr and state_dict round trip against
torch 2.13, and a resume from state_dicts that continues torch's sequence exactly."""
import pytest
import torch

from infini_train.optim import lr_scheduler as S
from tests.optim.test_lr_scheduler import T, optimizer_pair


def _step_both(pairs, o, t):
    o.step()
    t.step()
    for s, ts in pairs:
        s.step()
        ts.step()


def _assert_lrs(o, t, pairs, step):
    assert [g["lr"] for g in o.param_groups] == pytest.approx([g["lr"] for g in t.param_groups], rel=1e-12), step
    for s, ts in pairs:  # each scheduler's own last lrs (the intermediate ones too), as torch records them
        assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12, abs=1e-18), (step, type(s).__name__)


CHAINS = {
    "exponential_then_multistep": lambda o, M: [M.ExponentialLR(o, 0.9), M.MultiStepLR(o, [3, 6, 6], 0.1)],
    "multistep_then_exponential": lambda o, M: [M.MultiStepLR(o, [4], 0.5), M.ExponentialLR(o, 0.95)],
    "constant_warmup_and_cosine": lambda o, M: [M.ConstantLR(o, 0.25, 5), M.CosineAnnealingLR(o, 12, 0.0)],
    "linear_warmup_and_step": lambda o, M: [M.LinearLR(o, 0.1, 1.0, 6), M.StepLR(o, 4, 0.5)],
    "step_and_polynomial": lambda o, M: [M.StepLR(o, 5, 0.3), M.PolynomialLR(o, 15, 2.0)],
    "multiplicative_and_cosine": lambda o, M: [M.MultiplicativeLR(o, lambda e: 0.97),
                                               M.CosineAnnealingLR(o, 8, 0.001)],
    "three": lambda o, M: [M.LinearLR(o, 0.5, 1.0, 4), M.ExponentialLR(o, 0.9), M.MultiStepLR(o, [5, 9], 0.2)],
}


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_chained_schedulers_compose_like_torch(name, kind):
    o, t = optimizer_pair(kind)
    pairs = list(zip(CHAINS[name](o, S), CHAINS[name](t, T)))
    for step in range(25):
        _assert_lrs(o, t, pairs, step)
        _step_both(pairs, o, t)
    _assert_lrs(o, t, pairs, 25)


def test_exponential_then_multistep_is_the_product_of_both_factors():
    o, _ = optimizer_pair("sgd", lrs=(1.0,))
    exponential, multistep = S.ExponentialLR(o, 0.5), S.MultiStepLR(o, [2], 0.1)
    lrs = []
    for _ in range(4):
        lrs.append(o.param_groups[0]["lr"])
        o.step()
        exponential.step()
        multistep.step()
    assert lrs == pytest.approx([1.0, 0.5, 0.025, 0.0125], rel=1e-12)  # 0.5**k, times 0.1 from step 2 on


@pytest.mark.parametrize("name", ["exponential_then_multistep", "constant_warmup_and_cosine", "three"])
def test_chained_schedulers_resume_from_state_dicts_exactly(name):
    o, t = optimizer_pair("adamw")
    pairs = list(zip(CHAINS[name](o, S), CHAINS[name](t, T)))
    for _ in range(7):
        _step_both(pairs, o, t)
    opt_state, states = o.state_dict(), [s.state_dict() for s, _ in pairs]
    o2, _ = optimizer_pair("adamw", lrs=(0.5, 0.25))
    resumed = CHAINS[name](o2, S)
    o2.load_state_dict(opt_state)
    for s, state in zip(resumed, states):  # in stepping order
        s.load_state_dict(state)
    pairs2 = list(zip(resumed, [ts for _, ts in pairs]))
    for step in range(15):
        assert [g["lr"] for g in o2.param_groups] == [g["lr"] for g in o.param_groups], step
        _assert_lrs(o2, t, pairs2, step)
        o.step()
        for s, _ in pairs:
            s.step()
        _step_both(pairs2, o2, t)


def test_chained_scheduler_steps_all_like_torch_and_round_trips():
    o, t = optimizer_pair("sgd")
    s = S.ChainedScheduler([S.ConstantLR(o, 0.1, 3), S.ExponentialLR(o, 0.9)])
    ts = T.ChainedScheduler([T.ConstantLR(t, 0.1, 3), T.ExponentialLR(t, 0.9)])
    for step in range(6):
        _assert_lrs(o, t, [(s, ts)], step)
        _step_both([(s, ts)], o, t)
    state = s.state_dict()
    assert [inner["last_epoch"] for inner in state["_schedulers"]] == [6, 6]
    o2, _ = optimizer_pair("sgd")
    s2 = S.ChainedScheduler([S.ConstantLR(o2, 0.1, 3), S.ExponentialLR(o2, 0.9)])
    o2.load_state_dict(o.state_dict())
    s2.load_state_dict(state)
    for step in range(6):
        _assert_lrs(o2, t, [(s2, ts)], step)
        _step_both([(s2, ts)], o2, t)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        S.ChainedScheduler([S.ReduceLROnPlateau(o)])
    with pytest.raises(ValueError, match="at least one scheduler"):
        S.ChainedScheduler([])


@pytest.mark.parametrize("name,make", [
    ("MultiplicativeLR", lambda o, M: M.MultiplicativeLR(o, lambda e: 0.95)),
    ("MultiplicativeLR_per_group", lambda o, M: M.MultiplicativeLR(o, [lambda e: 0.9, lambda e: 1.0 + 0.01 * e])),
    ("PolynomialLR", lambda o, M: M.PolynomialLR(o, 10, 1.0)),
    ("PolynomialLR_squared", lambda o, M: M.PolynomialLR(o, 7, 2.0)),
])
def test_new_chainable_schedulers_match_torch_and_jump_by_epoch(name, make):
    o, t = optimizer_pair("sgd")
    pairs = [(make(o, S), make(t, T))]
    for step in range(14):
        _assert_lrs(o, t, pairs, step)
        _step_both(pairs, o, t)
    if name.startswith("PolynomialLR"):
        s, ts = pairs[0]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: the epoch argument is deprecated
            s.step(3)
            ts.step(3)
        _assert_lrs(o, t, pairs, "step(3)")


METRICS = [5.0, 4.0, 4.0, 3.9999, 4.1, 4.2, 4.3, 3.0, 3.0, 3.0, 3.0, 3.0, 2.0, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5]


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(patience=2, factor=0.5),
    dict(patience=1, cooldown=2, factor=0.3, min_lr=0.004),
    dict(mode="max", patience=0, threshold=0.1, threshold_mode="abs", min_lr=[0.01, 0.0]),
    dict(patience=0, threshold_mode="abs", threshold=0.5, eps=0.05),
], ids=["defaults", "patience2", "cooldown_min_lr", "max_abs", "eps"])
def test_reduce_lr_on_plateau_matches_torch(kwargs):
    o, t = optimizer_pair("adam")
    s, ts = S.ReduceLROnPlateau(o, **kwargs), T.ReduceLROnPlateau(t, **kwargs)
    for step, metric in enumerate(METRICS):
        o.step()
        t.step()
        s.step(metric)
        ts.step(torch.tensor(metric))
        _assert_lrs(o, t, [(s, ts)], step)
        assert (s.num_bad_epochs, s.cooldown_counter, s.best) == (ts.num_bad_epochs, ts.cooldown_counter, ts.best)
    state = s.state_dict()
    o2, _ = optimizer_pair("adam")
    s2 = S.ReduceLROnPlateau(o2, **kwargs)
    o2.load_state_dict(o.state_dict())
    s2.load_state_dict(state)
    for step, metric in enumerate(reversed(METRICS)):
        o2.step()
        t.step()
        s2.step(metric)
        ts.step(metric)
        _assert_lrs(o2, t, [(s2, ts)], step)


def test_reduce_lr_on_plateau_bad_arguments_are_clear():
    o, _ = optimizer_pair("sgd")
    with pytest.raises(ValueError, match="expected factor < 1.0, got 1.5"):
        S.ReduceLROnPlateau(o, factor=1.5)
    with pytest.raises(ValueError, match="mode 'min' or 'max'"):
        S.ReduceLROnPlateau(o, mode="lowest")
    with pytest.raises(ValueError, match="min_lr must have the same length"):
        S.ReduceLROnPlateau(o, min_lr=[0.1])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        S.SequentialLR(o, [S.ReduceLROnPlateau(o), S.ExponentialLR(o, 0.9)], [3])
