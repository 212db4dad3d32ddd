"""SGD against torch.optim.SGD (single-tensor path) over 20 steps."""
import pytest
import torch

import infini_train as it
from infini_train import optim
from tests.optim.trajectory import run_pair

CONFIGS = [dict(lr=0.1), dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9, nesterov=True),
           dict(lr=0.05, momentum=0.5, dampening=0.3), dict(lr=0.05, weight_decay=0.1),
           dict(lr=0.05, momentum=0.5, dampening=0.3, weight_decay=0.1),
           dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
           dict(lr=0.05, momentum=0.9, weight_decay=0.1, maximize=True),
           dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)]


@pytest.mark.parametrize("kw", CONFIGS, ids=str)
def test_sgd_matches_torch(kw):
    run_pair(optim.SGD, torch.optim.SGD, **kw)


def test_sgd_param_groups_and_round_trip():
    groups = [{"lr": 0.2, "weight_decay": 0.1}, {"lr": 0.01, "momentum": 0.5}]
    run_pair(optim.SGD, torch.optim.SGD, groups=groups, lr=0.05, momentum=0.9)
    opt, topt, ours, theirs = run_pair(optim.SGD, torch.optim.SGD, save_at=10, lr=0.1, momentum=0.9)
    buf = opt.state[ours[0]]["momentum_buffer"]
    assert buf.shape == (4, 3)
    assert abs(buf - topt.state[theirs[0]]["momentum_buffer"].numpy()).max() < 1e-5


def test_sgd_validates_options():
    p = [it.nn.Parameter(it.ones(1))]
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="lr"):
        optim.SGD(p, lr=-1)
