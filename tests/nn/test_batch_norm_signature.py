"""BatchNorm1d / 2d / 3d with torch 2.13's signature (keyword-only ``bias``): state_dict keys, torch state loaded,
outputs, input and parameter gradients and running statistics in train and eval mode for every combination of
affine, bias and track_running_stats."""
import inspect

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn

SHAPES = {"BatchNorm1d": [(6, 3), (6, 3, 5)], "BatchNorm2d": [(4, 3, 5, 5)], "BatchNorm3d": [(3, 3, 2, 3, 4)]}


@pytest.mark.parametrize("name", list(SHAPES))
def test_signature_equals_torchs(name):
    ours, theirs = inspect.signature(getattr(nn, name)), inspect.signature(getattr(torch.nn, name))
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
           [(p.name, p.kind, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"affine": False}, {"track_running_stats": False},
                                    {"bias": False, "momentum": None}])
def test_train_and_eval_match_torch(name, kwargs):
    rng = np.random.default_rng(7)
    theirs = getattr(torch.nn, name)(3, **kwargs)
    with torch.no_grad():
        for p in theirs.parameters():
            p.uniform_(0.5, 1.5)
    ours = getattr(nn, name)(3, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    for shape in SHAPES[name]:
        for step in range(2):
            x = (2 * rng.standard_normal(shape) + step).astype(np.float32)
            xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
            yi, yt = ours(xi), theirs(xt)
            (yi * yi).sum().backward()
            (yt * yt).sum().backward()
            np.testing.assert_allclose(yi.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)
        for (key, p), q in zip(ours.named_parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=key)
        for key, value in theirs.state_dict().items():
            np.testing.assert_allclose(ours.state_dict()[key].numpy(), value.numpy(), rtol=1e-5, atol=1e-6)
        ours.eval(), theirs.eval()
        np.testing.assert_allclose(ours(it.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
        ours.train(), theirs.train()


def test_a_wrong_rank_names_the_layer_and_the_shapes_it_takes():
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected a 2-D or 3-D input \(N, C\) or \(N, C, L\), got "
                                         r"input of shape \(2, 3, 4, 4\)"):
        nn.BatchNorm1d(3)(it.zeros(2, 3, 4, 4))
