import math
import warnings

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.activations import normal_cdf
from tests.autograd.test_low_precision import LOW, check_against_torch, normal
from tests.op_check import check_op

F = torch.nn.functional
# relu has a kink at 0 and softplus one at its threshold: finite differences need inputs away from them
AWAY_FROM_ZERO = np.array([[-2.0, -0.7, -0.1, 0.2], [0.5, 1.3, -1.1, 3.0]], np.float32)
SHAPES = [(3, 4), (2, 3, 4), (), (0, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ["sigmoid", "silu", "softplus"])
def test_smooth_activations(name, shape):
    check_op([shape], getattr(it, name), getattr(F, name), low=-4, high=4)


def test_relu():
    check_op([AWAY_FROM_ZERO], it.relu, torch.relu)
    check_op([AWAY_FROM_ZERO], lambda x: x.relu(), lambda x: x.relu())
    check_op([np.array(-0.5, np.float32)], it.relu, torch.relu)
    check_op([np.array(0.5, np.float32)], it.relu, torch.relu)
    check_op([(0, 3)], it.relu, torch.relu)


def test_relu_gradient_is_zero_at_and_below_zero():
    x = it.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    it.relu(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0])


def test_relu_backward_checks_its_saved_output_was_not_modified():
    x = it.tensor([-1.0, 2.0], requires_grad=True)
    y = it.relu(x)
    with it.no_grad():
        y.zero_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_sigmoid_method_and_extremes_are_finite_without_warnings():
    check_op([(5,)], lambda x: x.sigmoid(), lambda x: x.sigmoid())
    x = it.tensor([-1e4, -100.0, -30.0, 0.0, 100.0, 1e4], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = it.sigmoid(x)
        y.sum().backward()
    np.testing.assert_allclose(y.numpy(), torch.sigmoid(torch.tensor(x.numpy())).numpy(), rtol=1e-6, atol=0)
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 9.3576236e-14, 0.25, 0.0, 0.0], rtol=1e-5, atol=0)


def test_softplus_beta_threshold():
    check_op([(4, 5)], lambda x: it.softplus(x * 10, beta=2.0, threshold=5.0),
             lambda x: F.softplus(x * 10, beta=2.0, threshold=5.0), fd=False)
    # finite differences away from the threshold (beta * x = 5 at x = 2.5)
    x = np.array([-3.0, -0.4, 0.3, 2.0, 2.9, 6.0], np.float32)
    check_op([x], lambda x: it.softplus(x, beta=2.0, threshold=5.0), lambda x: F.softplus(x, beta=2.0, threshold=5.0))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu(approximate, shape):
    check_op([shape], lambda x: it.gelu(x, approximate=approximate),
             lambda x: F.gelu(x, approximate=approximate), low=-4, high=4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch_over_a_wide_range(approximate):
    x = np.concatenate([np.linspace(-12, 12, 2401), [0.0, -1e-30, 1e-30, 50.0, -50.0]]).astype(np.float32)
    # numpy's float32 tanh is 1 ulp short of -1 for arguments in (-10, -9.01) where torch's rounds to -1:
    # at x ~ -5.4 that turns a gradient of 0 into ~2e-6, so the tanh form gets atol 5e-6
    atol = 5e-6 if approximate == "tanh" else 1e-6
    check_op([x], lambda x: it.gelu(x, approximate=approximate),
             lambda x: F.gelu(x, approximate=approximate), fd=False, atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tanh_gelu_in_cache_sized_blocks_is_bitwise_one_whole_pass_and_matches_torch(dtype):
    """GPT-2's MLP activation at its size runs block by block (autograd/ops/blocked.py): the bits of the same kernels
    over the whole arrays at once, and torch's values and gradients."""
    from infini_train.autograd.ops.activations import _gelu_tanh_backward, _gelu_tanh_forward
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((256, 3072)) * 2).astype(np.float32)
    g = rng.standard_normal((256, 3072)).astype(np.float32)
    xt = it.tensor(x).to(dtype).requires_grad_(True)
    y = it.gelu(xt, approximate="tanh")
    y.backward(it.tensor(g).to(dtype))
    x_wide, g_low = xt.detach().to("float32").numpy(), it.tensor(g).to(dtype).numpy()
    t, whole, whole_grad = (np.empty_like(x_wide) for _ in range(3))
    _gelu_tanh_forward(np, x_wide, t, whole)
    _gelu_tanh_backward(np, x_wide, t, g_low, whole_grad)
    np.testing.assert_array_equal(y.detach().numpy(), whole.astype(y.detach().numpy().dtype))
    np.testing.assert_array_equal(xt.grad.numpy(), whole_grad.astype(xt.grad.numpy().dtype))
    tx = torch.tensor(x).to(getattr(torch, dtype)).requires_grad_(True)
    ty = F.gelu(tx, approximate="tanh")
    ty.backward(torch.tensor(g).to(getattr(torch, dtype)))
    tol = dict(rtol=1e-5, atol=5e-6) if dtype == "float32" else dict(rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(y.detach().to("float32").numpy(), ty.detach().float().numpy(), **tol)
    np.testing.assert_allclose(xt.grad.to("float32").numpy(), tx.grad.float().numpy(), **tol)


def test_normal_cdf_accuracy_in_both_tails():
    x64 = np.linspace(-37.0, 9.0, 4001)
    ref = np.array([0.5 * math.erfc(-v / math.sqrt(2.0)) for v in x64])
    # 5e-12: Cody's (0.47, 4] erfc rational is used down to 0 (within 5e-12 of erfc there)
    np.testing.assert_allclose(normal_cdf(np, x64), ref, rtol=5e-12, atol=0)
    x32 = np.linspace(-13.0, 9.0, 4001).astype(np.float32)
    got = normal_cdf(np, x32)
    assert got.dtype == np.float32
    ref = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2.0)) for v in x32])
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=0)  # a few float32 ulps, also at 1e-37
    special = normal_cdf(np, np.array([np.inf, -np.inf, 0.0, np.nan]))
    np.testing.assert_allclose(special, [1.0, 0.0, 0.5, np.nan], rtol=5e-12, atol=0)
    assert normal_cdf(np, np.array(-1.0)).shape == ()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_half_precision_keeps_dtype(approximate, dtype):
    x32 = np.linspace(-4, 4, 33, dtype=np.float32)
    x = it.tensor(x32).to(dtype).requires_grad_(True)
    y = it.gelu(x, approximate=approximate)
    assert y.dtype == x.dtype
    y.sum().backward()
    assert x.grad.dtype == x.dtype
    ref = F.gelu(torch.tensor(x.to("float32").numpy()), approximate=approximate).numpy()
    np.testing.assert_allclose(y.to("float32").numpy(), ref, rtol=1e-2, atol=1e-2)


def test_gelu_bad_approximate():
    with pytest.raises(ValueError, match="gelu: expected approximate='none' or 'tanh', got 'fast'"):
        it.gelu(it.ones(2), approximate="fast")


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["gelu tanh", "gelu", "silu", "sigmoid"])
def test_activations_low_precision_within_one_ulp_of_torch(name, dtype):
    # both compute in float32 and round once; float32 tanh/exp/erf implementations differ by float32 ulps, which
    # can tip the rounding to the neighbouring value. GELU(x) for x < -3 is 0.5 x (1 + tanh(..)), a cancellation
    # whose float32 error (~2^-24 |x| absolute) exceeds the tiny result's own ulp: there elements under 2^-10 of
    # the largest get the ulp at that floor
    ours, theirs = {"gelu tanh": (lambda x: it.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
                    "gelu": (it.gelu, F.gelu), "silu": (it.silu, F.silu), "sigmoid": (it.sigmoid, torch.sigmoid)}[name]
    x = normal(np.random.default_rng(0), (64, 96), dtype, scale=3.0)
    # torch's float16 sigmoid backward multiplies g (1 - y) y in float16, rounding twice more: 2 ulp there
    ulps = 2 if (name, dtype) == ("sigmoid", "float16") else 1
    check_against_torch(ours, theirs, [x], dtype, ulps=ulps, floor_fraction=2 ** -10, values=normal)
