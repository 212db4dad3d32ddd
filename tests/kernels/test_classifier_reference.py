"""The fused classifier (kernels/classifier.py) on the CPU: its NumPy reference (each thread's online max and sum,
the butterfly merges) against the array path's cross_entropy and torch's, forward and backward, with ignored rows,
-inf logits and large offsets; and cross_entropy's route to the kernels with the reference standing in for them (as if
on a GPU): taken only when the candidate switch names it, bit for bit the reference's results."""
import numpy as np
import pytest
import torch

import infini_train as it
import infini_train.nn.functional as F
from infini_train.autograd.ops import fused_classifier
from infini_train.autograd.ops.loss import CrossEntropy
from infini_train.kernels import classifier, registry
from infini_train.kernels.reference import classifier as ref


def _logits(dtype, rows=37, classes=1000, offset=0.0, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, classes)) * 3 + offset).astype(dtype)
    t = rng.integers(0, classes, rows)
    t[3] = t[rows // 2] = -100
    return x, t


def _array_path(x, t, reduction="mean"):
    logits = it.tensor(x, requires_grad=True)
    loss = F.cross_entropy(logits, it.tensor(t), reduction=reduction)
    loss.backward(it.ones_like(loss))
    return loss, logits.grad.numpy()


@pytest.mark.parametrize("dtype,offset", [("float32", 0.0), ("float32", 1e4), ("bfloat16", 0.0), ("float16", 0.0)])
def test_the_reference_matches_the_array_path_and_torch(dtype, offset):
    x, t = _logits(getattr(it, dtype), offset=offset)
    valid = t != -100
    losses, row_max, row_sum = ref.forward(x, t)
    scale = np.where(valid, 1.0 / valid.sum(), 0.0).astype(np.float32)
    grad = ref.backward(x, np.where(valid, t, 0), row_max, row_sum, scale)
    loss, want_grad = _array_path(x, t)
    tx = torch.tensor(x.astype(np.float32), requires_grad=True)
    torch_losses = torch.nn.functional.cross_entropy(tx, torch.tensor(t), reduction="none")
    torch_losses.sum().backward()
    # float32 log-sum-exp: its rounding at the logits' magnitude (1e4: 1e-3) is the loss's error
    atol = 4 * np.spacing(np.float32(np.abs(x.astype(np.float32)).max()))
    np.testing.assert_allclose(losses, torch_losses.detach().numpy(), rtol=1e-5, atol=atol)
    assert not losses[~valid].any()
    rounding = {"float32": 1e-6, "bfloat16": 4e-3, "float16": 5e-4}[dtype]  # the array path's loss is in the dtype
    np.testing.assert_allclose(losses[valid].astype(np.float64).mean(), float(loss.item()), rtol=max(rounding, 1e-5),
                               atol=atol)
    tol = rounding * np.abs(want_grad).max()
    np.testing.assert_allclose(grad.astype(np.float64), want_grad.astype(np.float64), rtol=0, atol=tol)


def test_minus_infinity_logits_add_nothing_and_exact_sums_stay_exact():
    x = np.zeros((3, 700), np.float32)  # exp(0) = 1: every sum exact, lse = log(700)
    x[1, ::3] = -np.inf
    losses, row_max, row_sum = ref.forward(x, np.array([5, 1, 699]))
    np.testing.assert_array_equal(row_max, 0)
    np.testing.assert_array_equal(row_sum, [700, 466, 700])
    np.testing.assert_array_equal(losses, np.log(np.float32([700, 466, 700])))


@pytest.fixture
def reference_kernel(monkeypatch):
    monkeypatch.setattr(fused_classifier, "applies", lambda logits: True)
    monkeypatch.setattr(classifier, "why_not", lambda x, t: None if registry.use(classifier.NAME) else "off")
    monkeypatch.setattr(classifier, "ready", lambda dtype: True)
    monkeypatch.setattr(classifier, "forward", lambda cp, *a: ref.forward(*a))
    monkeypatch.setattr(classifier, "backward", lambda cp, *a: ref.backward(*a))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_routes_to_the_kernels_only_with_the_switch(reference_kernel, reduction):
    x, t = _logits(it.bfloat16)
    with registry.selected("none"):
        want_loss, want_grad = _array_path(x, t, reduction)
        assert type(want_loss.grad_fn) is CrossEntropy
    with registry.selected("fused_classifier"):
        loss, grad = _array_path(x, t, reduction)
        assert type(loss.grad_fn) is fused_classifier.FusedCrossEntropy and loss.grad_fn.fused
    valid = t != -100
    losses, row_max, row_sum = ref.forward(x, np.where(valid, t, 0))
    losses = np.where(valid, losses.astype(np.float64), 0.0)
    expect = {"mean": losses.sum() / valid.sum(), "sum": losses.sum(), "none": losses}[reduction]
    np.testing.assert_array_equal(loss.numpy(), np.asarray(expect).astype(it.bfloat16))
    scale = np.where(valid, {"mean": 1.0 / valid.sum(), "sum": 1.0, "none": 1.0}[reduction], 0).astype(np.float32)
    np.testing.assert_array_equal(grad, ref.backward(x, np.where(valid, t, 0), row_max, row_sum, scale))
    np.testing.assert_allclose(loss.numpy().astype(np.float64), want_loss.numpy().astype(np.float64), rtol=1e-2)
    assert np.abs(grad.astype(np.float64) - want_grad.astype(np.float64)).max() <= 4e-3 * np.abs(want_grad).max()


def test_weights_smoothing_and_the_host_keep_the_array_code(reference_kernel, monkeypatch):
    x, t = _logits(np.float32)
    with registry.selected():
        smoothed = F.cross_entropy(it.tensor(x, requires_grad=True), it.tensor(t), label_smoothing=0.1)
        weighted = F.cross_entropy(it.tensor(x, requires_grad=True), it.tensor(t), weight=it.ones(1000))
        assert type(smoothed.grad_fn) is CrossEntropy and type(weighted.grad_fn) is CrossEntropy
        monkeypatch.undo()
        on_host, grad = _array_path(x, t)
        assert type(on_host.grad_fn) is CrossEntropy
    want, want_grad = _array_path(x, t)
    np.testing.assert_array_equal(on_host.numpy(), want.numpy())
    np.testing.assert_array_equal(grad, want_grad)


def test_double_backward_through_the_fused_op(reference_kernel):
    x, t = _logits(np.float32, rows=8, classes=50)
    results = []
    for spec in ("fused_classifier", "none"):
        with registry.selected(spec):
            logits = it.tensor(x, requires_grad=True)
            loss = F.cross_entropy(logits, it.tensor(t))
            (grad,) = it.autograd.grad(loss, logits, create_graph=True)
            (grad ** 2).sum().backward()
            results.append(logits.grad.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4, atol=1e-7)
