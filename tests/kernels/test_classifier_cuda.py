"""The fused classifier kernels on a GPU (kernels/registry.py): against their NumPy reference
(kernels/reference/classifier.py: the same order; the device's expf / logf within 2 ulps, so a float32 gradient
within 4, as seen on an H200: 3) and through cross_entropy against the array path. Marked cuda: skipped without
cupy and a GPU."""
import numpy as np
import pytest

import infini_train as it
import infini_train.nn.functional as F
from infini_train.kernels import classifier, registry
from infini_train.kernels.reference import classifier as ref
from tests.autograd.test_low_precision import assert_ulps

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")]


def _logits(dtype, rows, classes, offset=0.0):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, classes)) * 3 + offset).astype(dtype)
    t = rng.integers(0, classes, rows)
    t[::7] = -100
    return x, t


@pytest.mark.parametrize("dtype,rows,classes,offset", [("float32", 512, 50304, 0.0), ("bfloat16", 256, 50257, 0.0),
                                                       ("float16", 64, 1000, 0.0), ("float32", 64, 777, 1e4)])
def test_the_kernels_give_their_reference(dtype, rows, classes, offset):
    import cupy as cp

    x, t = _logits(getattr(it, dtype), rows, classes, offset)
    safe_t = np.where(t == -100, 0, t)
    scale = np.where(t == -100, 0.0, 1.0 / rows).astype(np.float32)
    xc = cp.asarray(x)
    with registry.selected("fused_classifier"):
        assert classifier.why_not(xc, cp.asarray(safe_t)) is None
        got = classifier.forward(cp, xc, cp.asarray(t), -100)
        got_grad = classifier.backward(cp, xc, cp.asarray(safe_t), got[1], got[2], cp.asarray(scale)).get()
    want = ref.forward(x, t)
    np.testing.assert_array_equal(got[1].get(), want[1])  # the max is exact
    for name, a, b in (("losses", got[0].get(), want[0]), ("row_sum", got[2].get(), want[2])):
        np.testing.assert_allclose(a, b, rtol=4e-6, atol=1e-6 * max(1.0, abs(offset)), err_msg=name)
    want_grad = ref.backward(x, safe_t, want[1], want[2], scale)
    assert_ulps(got_grad, want_grad.astype(np.float64), dtype, ulps=4 if dtype == "float32" else 1,
                floor=1e-3 * np.abs(want_grad.astype(np.float64)).max(), what="gradient")


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_with_the_kernels_against_the_array_path(dtype, reduction):
    from infini_train.autograd.ops.fused_classifier import FusedCrossEntropy

    x, t = _logits(getattr(it, dtype), 300, 50304)
    results = []
    for spec in ("fused_classifier", "none"):
        with registry.selected(spec):
            logits = it.tensor(x, device="cuda:0", requires_grad=True)
            loss = F.cross_entropy(logits, it.tensor(t, device="cuda:0"), reduction=reduction)
            assert (type(loss.grad_fn) is FusedCrossEntropy and loss.grad_fn.fused) == (spec != "none")
            loss.backward(it.ones_like(loss))
            results.append([loss.numpy().astype(np.float64), logits.grad.numpy().astype(np.float64)])
    (loss, grad), (want_loss, want_grad) = results
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5 if dtype == "float32" else 8e-3, atol=1e-5)
    assert np.abs(grad - want_grad).max() <= (1e-5 if dtype == "float32" else 8e-3) * np.abs(want_grad).max()
