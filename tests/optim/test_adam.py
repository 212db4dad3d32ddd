"""Adam and AdamW against torch.optim (single-tensor path) over 20 steps; allocation-free steps."""
import tracemalloc

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import optim
from tests.optim.trajectory import run_pair

PAIRS = [(optim.Adam, torch.optim.Adam), (optim.AdamW, torch.optim.AdamW)]


@pytest.mark.parametrize("cls,tcls", PAIRS, ids=["Adam", "AdamW"])
@pytest.mark.parametrize("kw", [dict(), dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.0),
                                dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
                                dict(lr=0.02, betas=(0.3, 0.9), eps=1e-6, weight_decay=0.05),
                                dict(lr=0.01, amsgrad=True, weight_decay=0.1),
                                dict(lr=0.01, maximize=True, weight_decay=0.1)], ids=str)
def test_adam_family_matches_torch(cls, tcls, kw):
    def check_state(step, opt, topt):
        if step in (0, 19):
            for p, tp in zip(opt.param_groups[0]["params"], topt.param_groups[0]["params"]):
                if tp not in topt.state:  # the parameter that never gets a gradient has no state
                    assert p not in opt.state
                    continue
                ours, theirs = opt.state[p], topt.state[tp]
                assert ours["step"] == int(theirs["step"]) == step + 1
                np.testing.assert_allclose(ours["exp_avg_sq"], theirs["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-9)

    run_pair(cls, tcls, on_step=check_state, **kw)


def test_adam_defaults_match_torch():
    p = [it.nn.Parameter(it.ones(1))]
    tp = [torch.nn.Parameter(torch.ones(1))]
    for cls, tcls in PAIRS:
        ours, theirs = cls(p).defaults, tcls(tp).defaults
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay"):
            assert ours[key] == theirs[key], (cls.__name__, key)


@pytest.mark.parametrize("cls,tcls", PAIRS, ids=["Adam", "AdamW"])
def test_param_groups_with_own_lr_and_weight_decay(cls, tcls):
    groups = [{"lr": 0.02, "weight_decay": 0.1}, {"lr": 0.005, "weight_decay": 0.0, "betas": (0.8, 0.99)}]
    run_pair(cls, tcls, groups=groups, lr=0.01)


@pytest.mark.parametrize("cls,tcls", PAIRS, ids=["Adam", "AdamW"])
def test_state_dict_round_trip_mid_run_continues_identically(cls, tcls):
    groups = [{"lr": 0.02, "weight_decay": 0.1}, {"lr": 0.005}]
    run_pair(cls, tcls, groups=groups, save_at=10, lr=0.01, weight_decay=0.05)


def test_adam_steps_do_not_allocate():
    p = it.nn.Parameter(it.randn(256, 256))
    for cls, kw in [(optim.AdamW, dict(weight_decay=0.1)), (optim.Adam, dict(weight_decay=0.1)),
                    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1))]:
        opt = cls([p], **kw)
        p.grad = it.randn(256, 256)
        opt.step()  # the first step allocates the state
        tracemalloc.start()
        for _ in range(3):
            opt.step()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 16_000, (cls.__name__, peak)  # a parameter is 262 kB: no temporaries of its size


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize("cls,kw", [(optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
                                    (optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
                                    (optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1))])
def test_optimizers_on_cuda_match_cpu_and_reload(cls, kw):
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal((6, 8, 5)).astype(np.float32)
    results = []
    for device in ("cpu", "cuda:0"):
        p = it.nn.Parameter(it.tensor(w0, device=device))
        opt = cls([p], **kw)
        for i, g in enumerate(grads):
            if i == 3:  # round trip through host arrays onto the device
                state = opt.state_dict()
                state["state"] = {k: {n: (v.numpy() if isinstance(v, it.Tensor) else v) for n, v in st.items()}
                                  for k, st in state["state"].items()}
                opt = cls([p], **kw)
                opt.load_state_dict(state)
            p.grad = it.tensor(g, device=device)
            opt.step()
        results.append(p.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls,tcls,kw", [(optim.AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
                                         (optim.Adam, torch.optim.Adam, dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
                                         (optim.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True,
                                                                           weight_decay=0.1))],
                         ids=["AdamW", "Adam", "SGD"])
def test_piecewise_and_strided_updates_match_torch(cls, tcls, kw, monkeypatch):
    """Pieces smaller than the parameters (chunk boundaries inside them) and a non-contiguous parameter."""
    from infini_train.optim import optimizer as base
    monkeypatch.setattr(base, "CPU_CHUNK", 5)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32).T]
    ours = [it.nn.Parameter(a) for a in arrays]  # the second one wraps a transposed (strided) view
    assert not ours[1].array.flags.c_contiguous
    theirs = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    opt, topt = cls(ours, **kw), tcls(theirs, foreach=False, **kw)
    for _ in range(8):
        for p, tp in zip(ours, theirs):
            g = rng.standard_normal(p.shape).astype(np.float32)
            p.grad, tp.grad = it.tensor(g), torch.tensor(g)
        opt.step()
        topt.step()
    for p, tp in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
