"""clip_grad_norm_ / clip_grad_value_ against torch.nn.utils."""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn


def make(scale=3.0, dtype=np.float32, with_none=True):
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5,), (2, 3, 2)]
    arrays = [(rng.standard_normal(s) * scale).astype(dtype) for s in shapes]
    ours = [nn.Parameter(it.tensor(rng.standard_normal(s).astype(dtype))) for s in shapes]
    theirs = [torch.nn.Parameter(torch.tensor(p.numpy())) for p in ours]
    for p, tp, g in zip(ours, theirs, arrays):
        p.grad, tp.grad = it.tensor(g), torch.tensor(g)
    if with_none:  # a parameter without a gradient is skipped
        ours.append(nn.Parameter(it.ones(2)))
        theirs.append(torch.nn.Parameter(torch.ones(2)))
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [1.0, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, theirs = make()
    total = nn.utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type, foreach=False)
    assert total.shape == () and total.dtype == it.float32
    assert total.item() == pytest.approx(ttotal.item(), rel=1e-6)
    for p, tp in zip(ours, theirs):
        if tp.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-6, atol=1e-7)
    if max_norm == 1.0:
        assert nn.utils.get_total_norm([p.grad for p in ours if p.grad is not None], norm_type) == \
            pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_float64_single_tensor_and_no_grads():
    ours, theirs = make(dtype=np.float64, with_none=False)
    total = nn.utils.clip_grad_norm_(ours[0], 0.5)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs[0], 0.5)
    assert total.item() == pytest.approx(ttotal.item(), rel=1e-12)
    np.testing.assert_allclose(ours[0].grad.numpy(), theirs[0].grad.numpy(), rtol=1e-12)
    assert nn.utils.clip_grad_norm_([nn.Parameter(it.ones(2))], 1.0).item() == 0.0


def test_clip_grad_norm_measures_only_with_infinite_max_norm_and_flags_nonfinite():
    ours, _ = make(with_none=False)
    before = [p.grad.numpy().copy() for p in ours]
    total = nn.utils.clip_grad_norm_(ours, float("inf")).item()
    want = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in before))
    assert total == pytest.approx(want, rel=1e-6)
    for p, g in zip(ours, before):
        np.testing.assert_array_equal(p.grad.numpy(), g)
    ours[0].grad.array[0, 0] = np.nan
    with pytest.raises(RuntimeError, match="total norm"):
        nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)


def test_clip_grad_value_matches_torch():
    ours, theirs = make()
    nn.utils.clip_grad_value_(ours, 1.5)
    torch.nn.utils.clip_grad_value_(theirs, 1.5, foreach=False)
    for p, tp in zip(ours, theirs):
        if tp.grad is not None:
            np.testing.assert_array_equal(p.grad.numpy(), tp.grad.numpy())
