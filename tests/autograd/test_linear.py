import numpy as np
import pytest
import torch

import infini_train as it
from tests.autograd.test_low_precision import LOW, check_against_torch, dyadic, normal
from tests.op_check import check_op

F = torch.nn.functional


@pytest.mark.parametrize("xshape", [(5,), (4, 5), (2, 3, 5), (0, 5)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch_and_finite_differences(xshape, bias):
    # atol 1e-5: float32 dot products of length 5 on inputs in [-2, 2] (values up to ~20)
    specs = [xshape, (3, 5), (3,)] if bias else [xshape, (3, 5)]
    check_op(specs, it.linear, F.linear, atol=1e-5)


def test_linear_larger_shapes_and_non_contiguous_x():
    check_op([(2, 33, 48), (40, 48), (40,)], it.linear, F.linear, rtol=1e-4, atol=1e-4, fd=False)
    # x arrives transposed (a strided view): forward reshapes it, backward must undo that
    check_op([(5, 2, 4), (3, 5)], lambda x, w: it.linear(x.transpose(0, 2), w),
             lambda x, w: F.linear(x.transpose(0, 2), w), atol=1e-5)


def test_linear_skips_inputs_without_grad():
    rng = np.random.default_rng(0)
    x = it.tensor(rng.standard_normal((4, 5)).astype(np.float32))
    w = it.tensor(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    b = it.tensor(rng.standard_normal(3).astype(np.float32))
    y = it.linear(x, w, b)
    assert y.grad_fn.saved_arrays[1] is None  # weight is only needed for x's gradient: not kept
    y.backward(it.ones(4, 3))
    assert x.grad is None and b.grad is None
    np.testing.assert_allclose(w.grad.numpy(), np.ones((3, 4), np.float32) @ x.numpy(), rtol=1e-6)
    with it.no_grad():
        assert it.linear(x, w, b).grad_fn is None


def test_linear_float64_keeps_dtype():
    x, w, b = it.ones(2, 3, dtype=it.float64), it.ones(4, 3, dtype=it.float64), it.ones(4, dtype=it.float64)
    y = it.linear(x, w, b)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.numpy(), np.full((2, 4), 4.0))


def test_linear_errors():
    with pytest.raises(ValueError, match=r"linear: expected x of shape \(\.\.\., 5\) for weight \(3, 5\), "
                                         r"got x of shape \(2, 4\)\nHINT: weight is \(out_features, in_features\)"):
        it.linear(it.ones(2, 4), it.ones(3, 5))
    with pytest.raises(ValueError, match=r"linear: expected bias of shape \(3,\) \(out_features\), got bias of "
                                         r"shape \(4,\)"):
        it.linear(it.ones(2, 5), it.ones(3, 5), it.ones(4))
    with pytest.raises(ValueError, match=r"linear: expected x, weight and bias of one dtype, got x float64, "
                                         r"weight float32\nHINT: cast"):
        it.linear(it.ones(2, 5, dtype=it.float64), it.ones(3, 5))
    with pytest.raises(ValueError, match=r"linear: expected x, weight and bias of one dtype, .*bias float64"):
        it.linear(it.ones(2, 5), it.ones(3, 5), it.ones(3, dtype=it.float64))
    with pytest.raises(ValueError, match=r"linear: expected a 2-D weight \(out_features, in_features\), got weight "
                                         r"of shape \(5,\)"):
        it.linear(it.ones(2, 5), it.ones(5))
    with pytest.raises(ValueError, match=r"linear: expected x of shape \(\.\.\., 5\)"):
        it.linear(it.tensor(1.0), it.ones(3, 5))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_low_precision_equals_torch_bit_for_bit_on_exact_sums(bias, dtype):
    # dyadic inputs make x W^T + b exact in float32: torch adds the bias in float32 and rounds once, so must we
    # (rounding x W^T first and then adding b differs in ~1/4 of the elements)
    rng = np.random.default_rng(0)
    shapes = [(2, 7, 48), (24, 48), (24,)] if bias else [(2, 7, 48), (24, 48)]
    check_against_torch(it.linear, F.linear, [dyadic(rng, s, dtype) for s in shapes], dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_linear_low_precision_within_one_ulp_of_torch(dtype):
    # random inputs: float32 sums in another order may round to the neighbouring value
    rng = np.random.default_rng(1)
    arrays = [normal(rng, (2, 9, 96), dtype), normal(rng, (80, 96), dtype, 0.1), normal(rng, (80,), dtype)]
    check_against_torch(it.linear, F.linear, arrays, dtype, ulps=1, values=normal)
