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
        assert nn.utils.get_total_norm([p.grad for p in ours if p.grad is not None], norm_type).item() == \
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


def pair_with(values, dtype=np.float32, tdtype=torch.float32):
    """Parameters (ours, torch's) whose gradients are ``values`` (one list per parameter)."""
    ours, theirs = [], []
    for v in values:
        g = np.asarray(v, np.float64)
        p, tp = nn.Parameter(it.zeros(g.shape, dtype=dtype)), torch.nn.Parameter(torch.zeros(g.shape, dtype=tdtype))
        p.grad, tp.grad = it.tensor(g.astype(dtype)), torch.tensor(g, dtype=tdtype)
        ours.append(p)
        theirs.append(tp)
    return ours, theirs


def assert_same_grads(ours, theirs, rtol=0.0):
    for p, tp in zip(ours, theirs):
        got, want = p.grad.numpy().astype(np.float64), tp.grad.double().numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=0)  # nan positions equal, other values equal


INF, NAN = math.inf, math.nan
NONFINITE = [("inf", [[1.0, INF, -2.0], [3.0, 0.0]]), ("minus_inf", [[1.0, -INF], [0.5, 4.0, 0.0]]),
             ("nan", [[1.0, NAN, 2.0], [3.0, -1.0]]), ("inf_and_nan", [[INF, 1.0], [NAN, 0.0]]),
             ("overflow", [[3e38, 3e38], [1.0, 2.0]])]  # finite gradients whose float32 norm overflows


NONFINITE_BY_NORM = [(name, values, norm_type) for name, values in NONFINITE for norm_type in (2.0, 1.0, 3.0, math.inf)
                     if not (name == "overflow" and norm_type == math.inf)]  # max |g| does not overflow


@pytest.mark.parametrize("name,values,norm_type", NONFINITE_BY_NORM, ids=[f"{n}-{t}" for n, _, t in NONFINITE_BY_NORM])
def test_clip_grad_norm_nonfinite_scales_like_torch(name, values, norm_type):
    ours, theirs = pair_with(values)
    total = nn.utils.clip_grad_norm_(ours, 1.0, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type=norm_type)
    assert total.dtype == it.float32 and total.shape == ()
    want = ttotal.item()
    assert (math.isnan(total.item()) and math.isnan(want)) or total.item() == want, (total.item(), want)
    assert not math.isfinite(want)
    assert_same_grads(ours, theirs)  # zeros, or nans where the gradient was inf (or everything nan for a nan norm)


@pytest.mark.parametrize("name,values", NONFINITE, ids=[n for n, _ in NONFINITE])
def test_clip_grad_norm_error_if_nonfinite_raises_torch_error(name, values):
    for norm_type in (2.0, 1.0) if name == "overflow" else (2.0, 1.0, math.inf):
        ours, theirs = pair_with(values)
        with pytest.raises(RuntimeError) as theirs_error:
            torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type=norm_type, error_if_nonfinite=True)
        with pytest.raises(RuntimeError) as ours_error:
            nn.utils.clip_grad_norm_(ours, 1.0, norm_type=norm_type, error_if_nonfinite=True)
        assert str(ours_error.value).splitlines()[0] == str(theirs_error.value)
        assert "HINT" in str(ours_error.value)
        assert_same_grads(ours, theirs)  # nothing was scaled
        for p, v in zip(ours, values):
            np.testing.assert_array_equal(p.grad.numpy(), np.asarray(v, np.float32))


def test_clip_grad_norm_infinite_max_norm_with_inf_grad_gives_nan_like_torch():
    ours, theirs = pair_with([[1.0, INF], [2.0]])
    assert nn.utils.clip_grad_norm_(ours, INF).item() == torch.nn.utils.clip_grad_norm_(theirs, INF).item() == INF
    assert_same_grads(ours, theirs)
    assert np.isnan(ours[1].grad.numpy()).all()  # inf / inf is nan: torch scales everything by nan
    ours, theirs = pair_with([[1.0, 2.0], [2.0]])
    nn.utils.clip_grad_norm_(ours, INF)
    torch.nn.utils.clip_grad_norm_(theirs, INF)
    assert_same_grads(ours, theirs)  # finite: left as they are


@pytest.mark.parametrize("norm_type", [0.0, 0.5, -1.0, -math.inf])
def test_clip_grad_norm_unusual_norm_types_match_torch(norm_type):
    values = [[1.0, 0.0, 3.0], [2.0, -4.0], [0.25, -0.5, 8.0, 1.5]]
    ours, theirs = pair_with(values)
    total = nn.utils.clip_grad_norm_(ours, 1.5, norm_type=norm_type)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.5, norm_type=norm_type)
    assert total.item() == pytest.approx(ttotal.item(), rel=1e-6)
    assert_same_grads(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("dtypes", [("float16",), ("bfloat16",), ("float16", "float32"), ("bfloat16", "float16"),
                                    ("float32", "float64")], ids=str)
def test_clip_grad_norm_low_precision_and_mixed_dtypes_match_torch(dtypes):
    rng = np.random.default_rng(3)
    ours, theirs = [], []
    for i, name in enumerate(dtypes * 2):
        g = rng.standard_normal(5 + i) * 4
        o, t = pair_with([g], getattr(it, name), getattr(torch, name))
        ours += o
        theirs += t
    total = nn.utils.clip_grad_norm_(ours, 1.0)
    ttotal = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert str(total.dtype) == str(ttotal.dtype).replace("torch.", "")
    assert total.item() == pytest.approx(ttotal.item(), rel=1e-2 if len(set(dtypes)) == 1 and dtypes[0] != "float32"
                                         else 1e-6)
    for p, tp in zip(ours, theirs):
        assert str(p.grad.dtype) == str(tp.grad.dtype).replace("torch.", "")
        np.testing.assert_allclose(p.grad.numpy().astype(np.float64), tp.grad.double().numpy(), rtol=1e-2)


def test_get_total_norm_returns_a_tensor_like_torch_and_empty_generator_warns():
    ours, theirs = pair_with([[3.0, 4.0], [12.0]])
    grads, tgrads = [p.grad for p in ours], [p.grad for p in theirs]
    total = nn.utils.get_total_norm(grads)
    assert isinstance(total, it.Tensor) and total.item() == torch.nn.utils.get_total_norm(tgrads).item() == 13.0
    assert nn.utils.get_total_norm(grads, math.inf).item() == 12.0
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.get_total_norm([it.tensor([INF])], error_if_nonfinite=True)
    with pytest.warns(UserWarning, match="empty generator"):
        assert nn.utils.clip_grad_norm_((p for p in []), 1.0).item() == 0.0
