import numpy as np
import pytest
import torch

import infini_train as it
from tests.autograd.test_low_precision import (LOW, assert_all_ulps, assert_ulps, cotangent_for, float32_reference,
                                               normal, outputs_and_grads)
from tests.op_check import check_op

F = torch.nn.functional


@pytest.mark.parametrize("shape,ns", [((4, 8), (8,)), ((2, 3, 6), (6,)), ((2, 3, 4), (3, 4)), ((5,), (5,)),
                                      ((2, 2, 3, 2), (2, 3, 2))], ids=str)
def test_layer_norm_with_affine(shape, ns):
    check_op([shape, ns, ns], lambda x, w, b: it.layer_norm(x, ns, w, b, eps=1e-5),
             lambda x, w, b: F.layer_norm(x, ns, w, b, eps=1e-5))


def test_layer_norm_without_affine_weight_only_and_bias_only():
    check_op([(3, 5)], lambda x: it.layer_norm(x, 5), lambda x: F.layer_norm(x, (5,)))
    check_op([(2, 3, 4)], lambda x: it.layer_norm(x, (3, 4)), lambda x: F.layer_norm(x, (3, 4)))
    check_op([(3, 5), (5,)], lambda x, w: it.layer_norm(x, 5, w), lambda x, w: F.layer_norm(x, (5,), w))
    check_op([(3, 5), (5,)], lambda x, b: it.layer_norm(x, 5, None, b), lambda x, b: F.layer_norm(x, (5,), None, b))


def test_layer_norm_gradient_subsets():
    # only weight and bias need grads (the input is a constant) and only the input does
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    check_op([x, (6,), (6,)], lambda x, w, b: it.layer_norm(x, 6, w, b), lambda x, w, b: F.layer_norm(x, (6,), w, b),
             grad_mask=[False, True, True])
    check_op([x, (6,), (6,)], lambda x, w, b: it.layer_norm(x, 6, w, b), lambda x, w, b: F.layer_norm(x, (6,), w, b),
             grad_mask=[True, False, False])


def test_layer_norm_gpt2_sized_rows_and_eps():
    check_op([(2, 16, 96), (96,), (96,)], lambda x, w, b: it.layer_norm(x, 96, w, b),
             lambda x, w, b: F.layer_norm(x, (96,), w, b), fd=False)
    # nearly constant rows: eps dominates the variance
    x = (1e-3 * np.random.default_rng(1).standard_normal((3, 7))).astype(np.float32)
    check_op([x, (7,), (7,)], lambda x, w, b: it.layer_norm(x, 7, w, b, eps=1e-2),
             lambda x, w, b: F.layer_norm(x, (7,), w, b, eps=1e-2))


def test_layer_norm_large_offset_and_non_contiguous_input():
    # mean 1e3 with unit spread: a float32 row sum is off by ~1e-4 sigma there (torch float32 is: 1.5e-4 off
    # the float64 result on this input); the residual-mean correction keeps us within 1e-6 of float64
    rng = np.random.default_rng(2)
    x = (1e3 + rng.standard_normal((4, 32))).astype(np.float32)
    w, b = rng.standard_normal((2, 32))
    got = it.layer_norm(it.tensor(x), 32, it.tensor(w.astype(np.float32)), it.tensor(b.astype(np.float32)))
    ref = F.layer_norm(torch.tensor(x, dtype=torch.float64), (32,), torch.tensor(w), torch.tensor(b)).numpy()
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=2e-6)
    xi = it.tensor(x, requires_grad=True)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    cot = rng.standard_normal((4, 32))
    (it.layer_norm(xi, 32) * it.tensor(cot.astype(np.float32))).sum().backward()
    (F.layer_norm(xt, (32,)) * torch.tensor(cot)).sum().backward()
    # backward rebuilds x-hat from the float32 mean (as torch does), representable only to 3e-5 near 1e3
    np.testing.assert_allclose(xi.grad.numpy(), xt.grad.numpy(), rtol=0, atol=5e-5)  # torch float32: 4e-5
    check_op([(6, 5)], lambda x: it.layer_norm(x.transpose(0, 1), 6), lambda x: F.layer_norm(x.t(), (6,)))


def test_layer_norm_empty_batch():
    check_op([(0, 4), (4,), (4,)], lambda x, w, b: it.layer_norm(x, 4, w, b),
             lambda x, w, b: F.layer_norm(x, (4,), w, b))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_layer_norm_half_precision_keeps_dtype(dtype):
    x32 = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32) * 3 + 2
    x = it.tensor(x32).to(dtype).requires_grad_(True)
    w = it.ones(64).to(dtype).requires_grad_(True)
    y = it.layer_norm(x, 64, w)
    assert y.dtype == x.dtype
    (y * y).sum().backward()
    assert x.grad.dtype == x.dtype and w.grad.dtype == w.dtype
    ref = F.layer_norm(torch.tensor(x.to("float32").numpy()), (64,)).numpy()
    np.testing.assert_allclose(y.to("float32").numpy(), ref, rtol=2e-2, atol=2e-2)


def test_layer_norm_statistics_not_the_normalised_input_are_kept():
    x = it.randn(4, 8, requires_grad=True)
    y = it.layer_norm(x, 8)
    mean, rstd = y.grad_fn.stashed
    assert mean.shape == (4, 1) and rstd.shape == (4, 1) and rstd.dtype == np.float32


def test_layer_norm_shape_errors():
    with pytest.raises(ValueError, match=r"layer_norm: expected input whose trailing dims are normalized_shape=\(4,\), "
                                         r"got input of shape \(2, 3\)"):
        it.layer_norm(it.ones(2, 3), 4)
    with pytest.raises(ValueError, match=r"layer_norm: expected input whose trailing .* got input of shape \(3,\)"):
        it.layer_norm(it.ones(3), (2, 3))
    with pytest.raises(ValueError, match=r"layer_norm: expected weight of shape \(3,\) \(= normalized_shape\), "
                                         r"got weight of shape \(4,\)"):
        it.layer_norm(it.ones(2, 3), 3, it.ones(4))
    with pytest.raises(ValueError, match=r"layer_norm: expected bias of shape \(2, 3\)"):
        it.layer_norm(it.ones(2, 3), (2, 3), None, it.ones(3))
    with pytest.raises(ValueError, match="layer_norm: expected a normalized_shape with at least one dim"):
        it.layer_norm(it.ones(2, 3), ())


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("params", ["float32", "same"])
def test_layer_norm_low_precision_input_with_float32_or_low_params(params, dtype):
    # torch accepts a float16/bfloat16 input with float32 weight and bias (what autocast hands layer_norm):
    # the output has the input's dtype, each gradient its tensor's
    rng = np.random.default_rng(0)
    param_dtype = np.float32 if params == "float32" else dtype
    arrays = [normal(rng, (64, 96), dtype, 2.0), 1 + normal(rng, (96,), param_dtype, 0.2),
              normal(rng, (96,), param_dtype, 0.2)]

    def ours(x, w, b):
        return it.layer_norm(x, 96, w, b)

    def theirs(x, w, b):
        return F.layer_norm(x, (96,), w, b)

    cotangent = cotangent_for(ours, arrays, normal)
    got, our_dtype = outputs_and_grads(it, ours, arrays, cotangent)
    assert our_dtype == dtype
    assert [g.dtype for g in got] == [np.dtype(dtype), np.dtype(dtype), np.dtype(param_dtype), np.dtype(param_dtype)]
    # statistics, normalisation and all three gradients in float32, each result rounded once: torch's float32
    # layer_norm rounded gives the same value but for float32 summation order (<= 1 ulp)
    wide = float32_reference(theirs, arrays, cotangent, np.float32)
    for k, (a, b) in enumerate(zip(got, wide)):
        if a.dtype == np.float32:  # float32 parameter gradients: sums of 64 rows, float32 rounding
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
        else:
            assert_ulps(a, b.astype(a.dtype), dtype, ulps=1, what=f"result {k}")
    # torch's own kernel: the same forward; its float16/bfloat16 backward rounds intermediates, within 3 ulp of
    # the largest gradient (measured <= 2.5 over seeds)
    theirs_low, their_dtype = outputs_and_grads(torch, theirs, arrays, cotangent)
    assert their_dtype == dtype
    assert_all_ulps(got[:1], theirs_low[:1], dtype, ulps=1)
    assert_all_ulps(got[1:], theirs_low[1:], dtype, ulps=3, floor_fraction=1.0)
