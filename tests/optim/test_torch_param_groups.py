"""Param groups with torch 2.13's keys (foreach, capturable, differentiable, fused, decoupled_weight_decay): our state
dicts' groups equal torch's key for key and in order; a torch state dict loads into ours (its extra keys and values
kept); ours, converted to torch tensors, loads into torch's optimizer and both continue alike; a state dict written
before these keys existed still loads."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import optim
from tests.optim.trajectory import loss, make_arrays

CASES = [("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
         ("Adam", dict()), ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1, maximize=True)),
         ("AdamW", dict()), ("AdamW", dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6))]
IDS = ["sgd", "sgd-nesterov", "adam", "adam-amsgrad", "adamw", "adamw-betas"]


def pair(name, kw, **extra):
    arrays = make_arrays()
    ours = [it.nn.Parameter(it.tensor(a)) for a in arrays]
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    mine, torchs = getattr(optim, name)(ours, **kw, **extra), getattr(torch.optim, name)(theirs, **kw, **extra)
    return (mine, ours), (torchs, theirs)


def steps(opt, ps, n, lib):
    x = lib.tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
    for _ in range(n):
        opt.zero_grad()
        loss(ps, x).backward()
        opt.step()


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_param_groups_have_torchs_keys_in_torchs_order(name, kw):
    (opt, _), (topt, _) = pair(name, kw)
    ours, theirs = opt.state_dict()["param_groups"], topt.state_dict()["param_groups"]
    assert [list(g) for g in ours] == [list(g) for g in theirs]
    assert ours == theirs


def test_flags_given_are_kept_as_torch_keeps_them():
    (opt, _), (topt, _) = pair("AdamW", {}, foreach=False, fused=False, capturable=True)
    assert opt.state_dict()["param_groups"] == topt.state_dict()["param_groups"]
    assert opt.param_groups[0]["capturable"] is True and opt.param_groups[0]["fused"] is False


def test_differentiable_and_bad_flags_are_refused_clearly():
    ps = [it.nn.Parameter(it.zeros(2))]
    with pytest.raises(NotImplementedError, match=r"(?s)differentiable=True.*HINT"):
        optim.Adam(ps, differentiable=True)
    with pytest.raises(TypeError, match="expected foreach=None, True or False, got 'yes'"):
        optim.SGD(ps, lr=0.1, foreach="yes")


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_ours_loads_into_torch_and_both_continue_alike(name, kw):
    (opt, ps), (topt, tps) = pair(name, kw)
    steps(opt, ps, 3, it)
    sd = opt.state_dict()
    converted = {"state": {i: {k: torch.tensor(v.numpy()) if isinstance(v, it.Tensor) else torch.tensor(float(v))
                               for k, v in st.items()} for i, st in sd["state"].items()},
                 "param_groups": sd["param_groups"]}
    with torch.no_grad():
        for tp, p in zip(tps, ps):
            tp.copy_(torch.tensor(p.numpy()))
    topt.load_state_dict(converted)
    assert topt.state_dict()["param_groups"] == sd["param_groups"]
    steps(opt, ps, 3, it)
    steps(topt, tps, 3, torch)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_torchs_loads_into_ours_with_its_extra_keys_and_values(name, kw):
    (opt, ps), (topt, tps) = pair(name, kw)
    steps(topt, tps, 3, torch)
    tsd = topt.state_dict()
    tsd["param_groups"][0]["initial_lr"] = 0.5  # a scheduler's key rides along, as in torch
    opt.load_state_dict({"state": {i: {k: v.numpy() for k, v in st.items()} for i, st in tsd["state"].items()},
                         "param_groups": tsd["param_groups"]})
    assert opt.state_dict()["param_groups"] == tsd["param_groups"]
    assert opt.param_groups[0]["foreach"] is None and opt.param_groups[0]["differentiable"] is False


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_a_state_dict_from_before_the_torch_keys_still_loads(name, kw):
    (opt, ps), _ = pair(name, kw)
    steps(opt, ps, 2, it)
    sd = opt.state_dict()
    flags = ("foreach", "capturable", "differentiable", "fused")
    old = {"state": sd["state"], "param_groups": [{k: v for k, v in g.items() if k not in flags}
                                                  for g in sd["param_groups"]]}
    if name == "AdamW":  # older AdamW groups carried no decoupled_weight_decay either
        old["param_groups"][0].pop("decoupled_weight_decay")
    (fresh, _), _ = pair(name, kw)
    fresh.load_state_dict(old)
    assert fresh.state_dict()["param_groups"] == sd["param_groups"]
