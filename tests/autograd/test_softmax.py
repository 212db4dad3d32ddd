import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.softmax import exp_and_sum, row_max, row_sum
from tests.autograd.test_low_precision import (LOW, assert_all_ulps, check_against_torch, cotangent_for,
                                               float32_reference, normal, outputs_and_grads)
from tests.op_check import check_op

NAMES = ["softmax", "log_softmax"]


def it_fn(name, dim):
    return lambda x: getattr(it, name)(x, dim)


def torch_fn(name, dim):
    return lambda x: getattr(torch, name)(x, dim)


@pytest.mark.parametrize("dim", [-1, 0, 1, 2, -3])
@pytest.mark.parametrize("name", NAMES)
def test_every_dim(name, dim):
    check_op([(3, 4, 5)], it_fn(name, dim), torch_fn(name, dim))


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((), 0), ((), -1), ((0, 3), -1), ((3, 0), -1), ((2, 1), -1)],
                         ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_small_zero_d_and_empty_shapes(name, shape, dim):
    check_op([shape], it_fn(name, dim), torch_fn(name, dim))


@pytest.mark.parametrize("name", NAMES)
def test_attention_shaped_rows_and_scaled_inputs(name):
    check_op([(2, 3, 16, 16)], it_fn(name, -1), torch_fn(name, -1), fd=False)
    check_op([(6, 33)], it_fn(name, -1), torch_fn(name, -1), low=-30, high=30, fd=False)


@pytest.mark.parametrize("name", NAMES)
def test_rows_of_plus_minus_1e4_are_finite_and_match_torch(name):
    rows = np.array([[1e4, -1e4, 0.0, 1e4],
                     [-1e4, -1e4, -1e4, -1e4],
                     [1e4, 1e4, 1e4, -1e4],
                     [-1e4, -9999.0, -1e4, -1e4 + 0.5],
                     [-0.0, -3.0, -1e4, -2.0]], np.float32)
    check_op([rows], it_fn(name, -1), torch_fn(name, -1), fd=False)
    check_op([rows], it_fn(name, 0), torch_fn(name, 0), fd=False)
    out = getattr(it, name)(it.tensor(rows), -1).numpy()
    assert np.isfinite(out).all()


@pytest.mark.parametrize("name", NAMES)
def test_unshifted_and_max_shifted_paths_agree(name):
    # everyday logits take exp(x) directly; +200 overflows exp in float32 and forces the max-shifted path
    x = np.random.default_rng(0).integers(-40 * 64, 40 * 64, (5, 30)).astype(np.float32) / 64  # exact after +200
    assert exp_and_sum(np, x, 1)[1] is None and exp_and_sum(np, x + 200, 1)[1] is not None
    plain = getattr(it, name)(it.tensor(x), -1).numpy()
    shifted = getattr(it, name)(it.tensor(x + 200), -1).numpy()
    np.testing.assert_allclose(plain, shifted, rtol=1e-6, atol=1e-7)
    check_op([x + 200], it_fn(name, -1), torch_fn(name, -1), fd=False)
    check_op([x - 200], it_fn(name, -1), torch_fn(name, -1), fd=False)  # exp underflows: shifted as well


@pytest.mark.parametrize("name", NAMES)
def test_masked_minus_inf_and_nan_rows_match_torch(name):
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf], [np.nan, 1.0, 2.0], [-1.0, -2.0, np.nan]], np.float32)
    got = getattr(it, name)(it.tensor(x), -1).numpy()
    ref = getattr(torch, name)(torch.tensor(x), -1).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got[:2], ref[:2], rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_non_contiguous_input_and_tensor_methods(name):
    check_op([(5, 4)], lambda x: getattr(x.transpose(0, 1), name)(-1), lambda x: getattr(x.t(), name)(-1))
    check_op([(2, 3)], lambda x: getattr(x, name)(0), lambda x: getattr(x, name)(0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_half_precision_is_computed_in_float32_and_keeps_its_dtype(name, dtype):
    x32 = np.random.default_rng(0).uniform(-8, 8, (4, 50)).astype(np.float32)
    x = it.tensor(x32).to(dtype).requires_grad_(True)
    y = getattr(it, name)(x, -1)
    assert y.dtype == x.dtype
    (y * it.tensor(np.linspace(0, 1, 50, dtype=np.float32)).to(dtype)).sum().backward()
    assert x.grad.dtype == x.dtype
    xt = torch.tensor(x.to("float32").numpy(), requires_grad=True)
    yt = getattr(torch, name)(xt, -1)
    (yt * torch.linspace(0, 1, 50)).sum().backward()
    tol = 1e-2 if dtype == "float16" else 5e-2  # the outputs themselves are rounded to 11 / 8 bits
    np.testing.assert_allclose(y.to("float32").numpy(), yt.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(x.grad.to("float32").numpy(), xt.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_max_through_integer_view_equals_max(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 9)).astype(dtype)
    x[:10] = -np.abs(x[:10]) - 1  # all-negative rows take the integer-minimum branch
    x[10, :] = -0.0
    x[11, 3] = 0.0
    x[12, :] = -np.inf
    x[13, 2] = np.inf
    x[14, :] = np.float32(-1e-40)  # subnormals
    for axis in (0, 1):
        got = row_max(np, x, axis)
        assert got.dtype == x.dtype
        np.testing.assert_array_equal(got, x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(row_sum(np, x[15:], 1), x[15:].sum(axis=1, keepdims=True), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(row_sum(np, x[15:], 0), x[15:].sum(axis=0, keepdims=True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_errors(name):
    with pytest.raises(ValueError, match=rf"{name}: expected dim in \[-2, 2\) for an input with 2 dims, got dim=2"):
        getattr(it, name)(it.ones(2, 3), 2)
    with pytest.raises(ValueError, match=f"{name}: expected a floating-point input"):
        getattr(it, name)(it.tensor([1, 2]), 0)


@pytest.mark.parametrize("dtype", LOW)
def test_softmax_low_precision_within_one_ulp_of_torch(dtype):
    # float32 exp and sums, one rounding; backward from the rounded output, as torch's: the float32 exp
    # implementations and summation orders differ, so the rounded results may be 1 ulp apart
    x = normal(np.random.default_rng(0), (64, 64), dtype, scale=3.0)
    check_against_torch(lambda t: it.softmax(t, -1), lambda t: torch.softmax(t, -1), [x], dtype, ulps=1,
                        values=normal)


@pytest.mark.parametrize("dtype", LOW)
def test_log_softmax_low_precision_rounds_the_float32_result_once(dtype):
    x = normal(np.random.default_rng(1), (64, 64), dtype, scale=3.0)
    cotangent = cotangent_for(lambda t: it.log_softmax(t, -1), [x], normal)
    ours, our_dtype = outputs_and_grads(it, lambda t: it.log_softmax(t, -1), [x], cotangent)
    assert our_dtype == dtype
    # forward: torch's float32 log_softmax rounded once gives our bits
    reference = float32_reference(lambda t: torch.log_softmax(t, -1), [x], cotangent, dtype)
    assert_all_ulps(ours[:1], reference[:1], dtype)
    # torch's float16/bfloat16 kernel: outputs near 0 (the row's largest logit) lose float32 bits to
    # x - max - log(sum) in its own order, so they match to 1 ulp at 2^-4 of the largest |output|; the gradient
    # g - exp(y) sum(g) takes exp of the rounded y (relative error up to an ulp of |y| in exp(y)), so both
    # frameworks are only within 1 ulp of the largest gradient of each other
    theirs, _ = outputs_and_grads(torch, lambda t: torch.log_softmax(t, -1), [x], cotangent)
    assert_all_ulps(ours[:1], theirs[:1], dtype, ulps=1, floor_fraction=2 ** -4)
    assert_all_ulps(ours[1:], theirs[1:], dtype, ulps=1, floor_fraction=1.0)
