import numpy as np
import pytest
import torch

import infini_train as it
from tests.autograd.test_low_precision import LOW, from_torch, normal, to_torch


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_fraction_scaling_and_gradient(p):
    it.manual_seed(0)
    x_np = np.random.default_rng(0).uniform(1.0, 2.0, (200, 500)).astype(np.float32)  # never 0
    x = it.tensor(x_np, requires_grad=True)
    y = it.dropout(x, p=p)
    out = y.numpy()
    assert out.dtype == np.float32
    kept = out != 0
    assert abs((1 - kept.mean()) - p) < 0.01  # 100k draws: std of the fraction is < 0.0016
    np.testing.assert_allclose(out[kept], x_np[kept] / (1 - p), rtol=1e-6)
    g = np.random.default_rng(1).standard_normal((200, 500)).astype(np.float32)
    y.backward(it.tensor(g))
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, g / (1 - p), 0.0), rtol=1e-6)


def test_dropout_is_reproducible_with_seed():
    it.manual_seed(3)
    a = it.dropout(it.ones(1000), 0.5).numpy()
    b = it.dropout(it.ones(1000), 0.5).numpy()
    it.manual_seed(3)
    c = it.dropout(it.ones(1000), 0.5).numpy()
    np.testing.assert_array_equal(a, c)
    assert (a != b).any()  # the generator moves on between calls


def test_dropout_float64_and_retained_graph():
    it.manual_seed(1)
    x = it.ones(6, 7, dtype=it.float64, requires_grad=True)
    y = it.dropout(x, 0.3)
    assert y.dtype == np.float64
    y.backward(it.ones(6, 7, dtype=it.float64), retain_graph=True)
    first = x.grad.numpy().copy()
    x.grad = None
    y.backward(it.ones(6, 7, dtype=it.float64))
    np.testing.assert_array_equal(x.grad.numpy(), first)
    np.testing.assert_array_equal(first, y.numpy())  # gradient of sum = mask * 1/(1-p) = y for x = 1


def test_dropout_identity_in_eval_or_p0_and_zeros_at_p1():
    x = it.ones(4, requires_grad=True)
    assert it.dropout(x, 0.5, training=False) is x
    assert it.dropout(x, 0.0) is x
    y = it.dropout(x, 1.0)
    np.testing.assert_array_equal(y.numpy(), 0.0)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0.0)


@pytest.mark.parametrize("p", [1.5, -0.1, "0.5", True, None])
def test_dropout_p_validation(p):
    with pytest.raises(ValueError, match=r"dropout: expected p in \[0, 1\], got .*\nHINT: p is the probability"):
        it.dropout(it.ones(2), p)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_low_precision_equals_torchs_formula_bit_for_bit(p, dtype):
    # torch scales by its mask in the input dtype, i.e. by 1/(1-p) rounded to that dtype (1.109375 in bfloat16 for
    # p = 0.1), and rounds x * factor once; float32 holds that product exactly, so ours must equal it bit for bit
    it.manual_seed(0)
    rng = np.random.default_rng(0)
    x_np, g_np = normal(rng, (64, 300), dtype), normal(rng, (64, 300), dtype)
    x = it.tensor(x_np, requires_grad=True)
    y = it.dropout(x, p)
    (keep,) = y.grad_fn.stashed
    y.backward(it.tensor(g_np))
    assert y.dtype == x.dtype and x.grad.dtype == x.dtype
    noise = torch.from_numpy(keep).to(getattr(torch, dtype)).div_(1 - p)  # torch's native_dropout mask
    np.testing.assert_array_equal(y.numpy().view(np.uint16), from_torch(to_torch(x_np) * noise).view(np.uint16))
    np.testing.assert_array_equal(x.grad.numpy().view(np.uint16),
                                  from_torch(to_torch(g_np) * noise).view(np.uint16))
