"""Optimizer base: param groups, zero_grad, state_dict layout (torch's), loading, errors."""
import json

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import optim
from infini_train.run_state import flatten_state, unflatten_state
from tests.optim.trajectory import loss, make_arrays


def params():
    return [it.nn.Parameter(it.tensor(a)) for a in make_arrays()]


def train(opt, ps, steps, x=None):
    x = it.tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)) if x is None else x
    for _ in range(steps):
        opt.zero_grad()
        loss(ps, x).backward()
        opt.step()


def test_state_dict_layout_matches_torch():
    ps = params()
    tps = [torch.nn.Parameter(torch.tensor(p.numpy())) for p in ps]
    groups = lambda q: [{"params": [q[0]], "lr": 0.1}, {"params": q[1:], "weight_decay": 0.0}]  # noqa: E731
    opt, topt = optim.AdamW(groups(ps), lr=0.01), torch.optim.AdamW(groups(tps), lr=0.01)
    train(opt, ps, 2)
    x = torch.tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
    for _ in range(2):
        topt.zero_grad()
        loss(tps, x).backward()
        topt.step()
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert list(sd) == ["state", "param_groups"]
    assert sorted(sd["state"]) == sorted(tsd["state"]) == [0, 1]  # index 2 never had a gradient
    assert set(sd["state"][0]) == set(tsd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in tsd["param_groups"]] == [[0], [1, 2]]
    for ours, theirs in zip(sd["param_groups"], tsd["param_groups"]):
        assert set(ours) <= set(theirs)
        assert all(ours[k] == theirs[k] for k in ("lr", "betas", "eps", "weight_decay"))


def test_state_dict_is_a_snapshot_and_survives_a_json_checkpoint():
    ps = params()
    opt = optim.AdamW(ps, lr=0.01)
    train(opt, ps, 3)
    sd = opt.state_dict()
    assert isinstance(sd["state"][0]["exp_avg"], it.Tensor) and sd["state"][0]["step"] == 3
    saved = sd["state"][0]["exp_avg"].numpy().copy()
    train(opt, ps, 1)
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"].numpy(), saved)  # later steps don't leak into it
    assert not any(k.startswith("_") for st in sd["state"].values() for k in st)  # no scratch buffers
    arrays, skeleton = flatten_state(sd)
    restored = unflatten_state(json.loads(json.dumps(skeleton)), arrays)
    fresh = optim.AdamW(params(), lr=0.5)
    fresh.load_state_dict(restored)
    assert fresh.param_groups[0]["lr"] == 0.01 and fresh.param_groups[0]["betas"] == (0.9, 0.999)
    assert fresh.state[fresh.param_groups[0]["params"][0]]["step"] == 3


def test_load_torch_state_dict_and_continue_like_torch():
    """A torch optimizer's state (converted to numpy) loads into ours; both then continue identically."""
    arrays = make_arrays()
    tps = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    topt = torch.optim.AdamW(tps, lr=0.01, weight_decay=0.1, foreach=False)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    xt = torch.tensor(x)

    def torch_steps(n):
        for _ in range(n):
            topt.zero_grad()
            loss(tps, xt).backward()
            topt.step()

    torch_steps(5)
    ps = [it.nn.Parameter(it.tensor(p.detach().numpy().copy())) for p in tps]
    opt = optim.AdamW(ps, lr=0.01, weight_decay=0.1)
    tsd = topt.state_dict()
    opt.load_state_dict({"state": {i: {k: v.numpy() for k, v in st.items()} for i, st in tsd["state"].items()},
                         "param_groups": tsd["param_groups"]})
    assert opt.state[ps[0]]["step"] == 5
    train(opt, ps, 5, it.tensor(x))
    torch_steps(5)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_zero_grad_and_skipping_params_without_grads():
    ps = params()
    opt = optim.SGD(ps, lr=0.1)
    train(opt, ps, 1)
    opt.zero_grad(set_to_none=False)
    assert ps[0].grad is not None and not ps[0].grad.numpy().any() and ps[2].grad is None
    before = [p.numpy().copy() for p in ps]
    opt.step()  # zero grads: SGD without decay leaves the parameters as they are
    for p, b in zip(ps, before):
        np.testing.assert_array_equal(p.numpy(), b)
    opt.zero_grad()
    assert all(p.grad is None for p in ps)


def test_add_param_group_and_per_group_options():
    ps = params()
    opt = optim.SGD(ps[:2], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": ps[2], "lr": 0.5})
    assert len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[1]["momentum"] == 0.9
    assert "Parameter Group 1" in repr(opt)


def test_optimizer_errors():
    ps = params()
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="iterable"):
        optim.SGD(ps[0], lr=0.1)
    with pytest.raises(ValueError, match="unknown param group option"):
        optim.SGD([{"params": ps, "lrr": 0.1}], lr=0.1)
    with pytest.raises(ValueError, match="more than one param group"):
        optim.SGD([{"params": ps[:2]}, {"params": ps[1:]}], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([ps[0] * 2], lr=0.1)
    opt = optim.Adam(ps, lr=0.1)
    with pytest.raises(ValueError, match=r"hold \[2\] parameters, this optimizer's hold \[3\]"):
        opt.load_state_dict(optim.Adam(ps[:2]).state_dict())
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(ps, betas=(0.9, 1.0))
    train(opt, ps, 1)
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="exp_avg"):
        optim.Adam(params()).load_state_dict(sd)


@pytest.mark.parametrize("cls,tcls,kw", [(optim.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
                                         (optim.Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
                                         (optim.AdamW, torch.optim.AdamW, dict(lr=0.01, betas=(0.8, 0.9)))],
                         ids=["SGD", "Adam", "AdamW"])
def test_step_with_closure_matches_torch(cls, tcls, kw):
    """step(closure): the closure runs with grad enabled before the update, and step returns its loss."""
    arrays = make_arrays()
    ps = [it.nn.Parameter(it.tensor(a)) for a in arrays]
    tps = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    opt, topt = cls(ps, **kw), tcls(tps, foreach=False, **kw)
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    calls = []

    def closure():
        calls.append(it.is_grad_enabled())
        opt.zero_grad()
        value = loss(ps, it.tensor(x))
        value.backward()
        return value

    def tclosure():
        topt.zero_grad()
        value = loss(tps, torch.tensor(x))
        value.backward()
        return value

    losses, tlosses = [], []
    with it.no_grad():  # step enables grad for the closure whatever the caller's mode
        for _ in range(6):
            losses.append(opt.step(closure).item())
            tlosses.append(topt.step(tclosure).item())
        assert not it.is_grad_enabled()  # and restores the caller's mode
    assert calls == [True] * 6
    np.testing.assert_allclose(losses, tlosses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert opt.step() is None  # without a closure, as torch
    with pytest.raises(TypeError, match="closure must be a callable"):
        opt.step(3.0)


@pytest.mark.parametrize("make", [
    lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True),
    lambda ps: optim.Adam(ps, lr=0.01, weight_decay=0.1, maximize=True),
    lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.1),
], ids=["adamw", "adam-amsgrad-l2", "adam-maximize-l2", "sgd-nesterov-l2"])
def test_an_update_shared_among_host_threads_is_bitwise_the_one_thread_update(make):
    """A parameter of 2.6 threaded pieces: split between two threads, each with its own scratch rows."""
    from infini_train import host_threads
    from infini_train.optim.optimizer import THREADED_CPU_CHUNK
    rng = np.random.default_rng(0)
    shapes = [(int(2.6 * THREADED_CPU_CHUNK) // 100, 100), (7,)]
    weights = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    before = host_threads.get_num_threads()
    finals = []
    try:
        for threads in (1, 2):
            host_threads.set_num_threads(threads)
            ps = [it.nn.Parameter(it.tensor(w.copy())) for w in weights]
            opt = make(ps)
            for step_grads in grads:
                for p, g in zip(ps, step_grads):
                    p.grad = it.tensor(g)
                opt.step()
            assert {key[2] for key in opt._workspaces} == set(range(threads))  # each thread's scratch rows
            finals.append([p.numpy().copy() for p in ps])
    finally:
        host_threads.set_num_threads(before)
    for one, two, w in zip(*finals, weights):
        assert not np.array_equal(one, w)
        np.testing.assert_array_equal(one, two)
