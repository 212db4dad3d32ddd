import re

import numpy as np
import pytest
import torch

import infini_train as it
from tests.autograd.test_low_precision import (LOW, assert_all_ulps, check_against_torch, cotangent_for, dyadic,
                                               float32_reference, normal, outputs_and_grads)
from tests.op_check import check_op


@pytest.mark.parametrize("shapes", [
    [(3, 4), (4, 5)],
    [(4,), (4,)],
    [(4,), (4, 5)],
    [(3, 4), (4,)],
    [(2, 3, 4), (4, 5)],
    [(3, 4), (2, 4, 5)],
    [(2, 1, 3, 4), (5, 4, 2)],
    [(0, 4), (4, 3)],
], ids=str)
def test_matmul(shapes):
    check_op(shapes, it.matmul, torch.matmul, rtol=1e-5, atol=1e-5)


def test_matmul_operator():
    check_op([(3, 4), (4, 2)], lambda a, b: a @ b, lambda a, b: a @ b, atol=1e-5)


def test_matmul_errors_are_clear():
    msg = r"matmul: expected a.shape\[-1\] == b.shape\[-2\], got shapes \(2, 3\) and \(4, 5\)"
    with pytest.raises(ValueError, match=msg):
        it.ones(2, 3) @ it.ones(4, 5)
    with pytest.raises(ValueError, match="matmul: expected m1 and m2 to have the same dtype, got float32 != float64\n"
                                         "HINT: cast one operand"):
        it.ones(2, 3) @ it.ones(3, 2, dtype=it.float64)


@pytest.mark.parametrize("shape_a,shape_b", [((2, 3, 4), (3, 4, 5)), ((2, 1, 3, 4), (3, 3, 4, 5)),
                                             ((3, 2, 4), (2, 4, 5))], ids=str)
def test_matmul_batch_mismatch_names_op_shapes_and_hint(shape_a, shape_b):
    a, b = it.ones(*shape_a), it.ones(*shape_b)
    message = (rf"matmul: expected batch dims \(all but the last two\) that broadcast, got shapes "
               rf"{re.escape(str(shape_a))} and {re.escape(str(shape_b))}, batch dims .*\nHINT: batch sizes must be")
    with pytest.raises(ValueError, match=message) as info:
        it.matmul(a, b)
    assert "inputs:" not in str(info.value)  # our check, not a wrapped numpy message
    with pytest.raises(RuntimeError):
        torch.ones(shape_a) @ torch.ones(shape_b)


def test_matmul_batch_dims_of_one_or_missing_broadcast():
    assert (it.ones(5, 2, 3, 4) @ it.ones(4, 5)).shape == (5, 2, 3, 5)
    assert (it.ones(2, 1, 3, 4) @ it.ones(6, 4, 5)).shape == (2, 6, 3, 5)


def test_matmul_of_integers_keeps_the_dtype():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    got = it.matmul(it.tensor(a), it.tensor(a.T.copy()))
    assert got.dtype == it.int32
    np.testing.assert_array_equal(got.numpy(), a @ a.T)


# ------------------------------------------------------------------------------------------ mm / bmm
@pytest.mark.parametrize("shapes", [[(3, 4), (4, 5)], [(1, 4), (4, 1)], [(0, 4), (4, 3)], [(3, 0), (0, 2)]], ids=str)
def test_mm(shapes):
    check_op(shapes, it.mm, torch.mm, atol=1e-5)


@pytest.mark.parametrize("shapes", [[(2, 3, 4), (2, 4, 5)], [(1, 2, 3), (1, 3, 1)], [(0, 2, 3), (0, 3, 4)]], ids=str)
def test_bmm(shapes):
    check_op(shapes, it.bmm, torch.bmm, atol=1e-5)


@pytest.mark.parametrize("fn,shape_a,shape_b,message", [
    ("mm", (2, 3, 4), (4, 5), r"mm: expected 2-D matrices, got shapes \(2, 3, 4\) and \(4, 5\)\nHINT: use matmul"),
    ("mm", (3,), (3, 5), "mm: expected 2-D matrices"),
    ("mm", (2, 3), (4, 5), r"mm: expected a.shape\[-1\] == b.shape\[-2\], got shapes \(2, 3\) and \(4, 5\)"),
    ("bmm", (3, 4), (2, 4, 5), r"bmm: expected 3-D batch1 and batch2 .* got shapes \(3, 4\) and \(2, 4, 5\)"),
    ("bmm", (3, 3, 4), (2, 4, 5), "bmm: expected equal batch sizes.*\nHINT: bmm does not broadcast"),
    ("bmm", (1, 3, 4), (2, 4, 5), "bmm: expected equal batch sizes"),
    ("bmm", (2, 3, 4), (2, 3, 5), r"bmm: expected a.shape\[-1\] == b.shape\[-2\]"),
], ids=str)
def test_mm_bmm_shape_errors(fn, shape_a, shape_b, message):
    with pytest.raises(ValueError, match=message):
        getattr(it, fn)(it.ones(*shape_a), it.ones(*shape_b))
    with pytest.raises(RuntimeError):
        getattr(torch, fn)(torch.ones(shape_a), torch.ones(shape_b))


@pytest.mark.parametrize("fn,shape_a,shape_b", [("mm", (2, 3), (3, 4)), ("bmm", (2, 2, 3), (2, 3, 4))])
def test_mm_bmm_dtype_mismatch(fn, shape_a, shape_b):
    with pytest.raises(ValueError, match=rf"{fn}: expected m1 and m2 to have the same dtype, got float32 != float64"):
        getattr(it, fn)(it.ones(*shape_a), it.ones(*shape_b, dtype=it.float64))
    with pytest.raises(RuntimeError):
        getattr(torch, fn)(torch.ones(shape_a), torch.ones(shape_b, dtype=torch.float64))


# ------------------------------------------------------------------------------------------- baddbmm
@pytest.mark.parametrize("shape_in", [(2, 3, 5), (3, 5), (5,), (1, 3, 1), ()], ids=str)
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, -1.5), (2, 0)], ids=str)
def test_baddbmm(shape_in, beta, alpha):
    check_op([shape_in, (2, 3, 4), (2, 4, 5)],
             lambda c, b1, b2: it.baddbmm(c, b1, b2, beta=beta, alpha=alpha),
             lambda c, b1, b2: torch.baddbmm(c, b1, b2, beta=beta, alpha=alpha), atol=1e-5)


def test_baddbmm_with_beta_zero_ignores_nan_and_inf_in_input():
    c = np.full((2, 3, 5), np.nan, np.float32)
    c[0, 0, 0] = np.inf
    b1, b2 = np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32)
    c_it = it.tensor(c, requires_grad=True)
    out = it.baddbmm(c_it, it.tensor(b1), it.tensor(b2), beta=0)
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3, 5), 4.0))
    np.testing.assert_array_equal(out.numpy(), torch.baddbmm(torch.tensor(c), torch.tensor(b1), torch.tensor(b2),
                                                             beta=0).numpy())
    out.sum().backward()
    np.testing.assert_array_equal(c_it.grad.numpy(), np.zeros((2, 3, 5)))  # torch: grad * 0, not None


@pytest.mark.parametrize("shapes,message", [
    ([(4, 5), (2, 3, 4), (2, 4, 5)], r"baddbmm: expected an input that broadcasts to the output shape \(2, 3, 5\)"),
    ([(7, 2, 3, 5), (2, 3, 4), (2, 4, 5)], "baddbmm: expected an input that broadcasts"),
    ([(2, 3, 5), (3, 4), (2, 4, 5)], "baddbmm: expected 3-D batch1 and batch2"),
    ([(2, 3, 5), (2, 3, 4), (2, 3, 5)], r"baddbmm: expected a.shape\[-1\] == b.shape\[-2\]"),
], ids=str)
def test_baddbmm_shape_errors(shapes, message):
    with pytest.raises(ValueError, match=message):
        it.baddbmm(*[it.ones(*s) for s in shapes])
    with pytest.raises(RuntimeError):
        torch.baddbmm(*[torch.ones(s) for s in shapes])


def test_baddbmm_dtype_errors():
    with pytest.raises(ValueError, match="baddbmm: expected input of the same dtype as batch1 and batch2"):
        it.baddbmm(it.ones(2, 3, 5, dtype=it.float64), it.ones(2, 3, 4), it.ones(2, 4, 5))
    with pytest.raises(ValueError, match="baddbmm: expected m1 and m2 to have the same dtype"):
        it.baddbmm(it.ones(2, 3, 5), it.ones(2, 3, 4), it.ones(2, 4, 5, dtype=it.float64))


# ------------------------------------------------------------------------------------- double backward
def _grads_of_grads(lib, fn, arrays):
    """Gradients of <grad(<fn(x), c>), w> with respect to the inputs: the create_graph path of backward."""
    rng = np.random.default_rng(1)
    xs = [lib.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    cot = lib.tensor(rng.standard_normal(tuple(out.shape)).astype(np.float32))
    firsts = lib.autograd.grad((out * cot).sum(), xs, create_graph=True)
    weights = [lib.tensor(rng.standard_normal(a.shape).astype(np.float32)) for a in arrays]
    total = sum((g * w).sum() for g, w in zip(firsts, weights))
    seconds = lib.autograd.grad(total, xs, allow_unused=True)
    return [np.zeros(a.shape, np.float32) if s is None else s.detach().numpy() for s, a in zip(seconds, arrays)]


@pytest.mark.parametrize("name,shapes,kwargs", [
    ("matmul", [(3, 4), (4, 5)], {}), ("matmul", [(4,), (4, 5)], {}), ("matmul", [(3, 4), (4,)], {}),
    ("matmul", [(4,), (4,)], {}), ("matmul", [(2, 1, 3, 4), (5, 4, 2)], {}), ("mm", [(3, 4), (4, 5)], {}),
    ("bmm", [(2, 3, 4), (2, 4, 5)], {}), ("baddbmm", [(3, 5), (2, 3, 4), (2, 4, 5)], {"beta": 0.5, "alpha": 2.0}),
], ids=str)
def test_double_backward_matches_torch(name, shapes, kwargs):
    arrays = [np.random.default_rng(0).uniform(-1, 1, s).astype(np.float32) for s in shapes]
    got = _grads_of_grads(it, lambda *xs: getattr(it, name)(*xs, **kwargs), arrays)
    expect = _grads_of_grads(torch, lambda *xs: getattr(torch, name)(*xs, **kwargs), arrays)
    for g, e in zip(got, expect):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert any(np.abs(e).sum() > 0 for e in expect)  # the second derivative of a product is not zero


LOW_PRECISION_PRODUCTS = {
    "matmul 2-D": ([(6, 40), (40, 5)], it.matmul, torch.matmul),
    "matmul vector-matrix": ([(40,), (3, 40, 5)], it.matmul, torch.matmul),
    "mm": ([(6, 40), (40, 5)], it.mm, torch.mm),
    "bmm": ([(3, 6, 40), (3, 40, 5)], it.bmm, torch.bmm),
    "baddbmm": ([(1, 6, 5), (3, 6, 40), (3, 40, 5)], lambda c, a, b: it.baddbmm(c, a, b, beta=0.5, alpha=2),
                lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2)),
}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", list(LOW_PRECISION_PRODUCTS))
def test_low_precision_products_equal_torch_bit_for_bit_on_exact_sums(case, dtype):
    # dyadic inputs: products and float32 sums are exact in any order, so both frameworks round one and the same
    # float32 value (forward and every gradient; scaling by alpha = 2 commutes with rounding)
    shapes, ours, theirs = LOW_PRECISION_PRODUCTS[case]
    rng = np.random.default_rng(0)
    check_against_torch(ours, theirs, [dyadic(rng, s, dtype) for s in shapes], dtype)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", list(LOW_PRECISION_PRODUCTS))
def test_low_precision_products_within_one_ulp_of_torch(case, dtype):
    # random inputs: float32 sums taken in another order (sgemm vs oneDNN) may fall on the other side of a
    # rounding boundary, 1 ulp apart
    shapes, ours, theirs = LOW_PRECISION_PRODUCTS[case]
    rng = np.random.default_rng(1)
    check_against_torch(ours, theirs, [normal(rng, s, dtype) for s in shapes], dtype, ulps=1, values=normal)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_baddbmm_with_any_alpha_within_one_ulp_of_torch(dtype):
    # torch's backward rounds bmm(g, b2^T) and then again after * alpha; ours rounds (alpha g) b2^T once
    rng = np.random.default_rng(2)
    arrays = [normal(rng, s, dtype) for s in [(3, 6, 5), (3, 6, 40), (3, 40, 5)]]
    check_against_torch(lambda c, a, b: it.baddbmm(c, a, b, beta=-0.75, alpha=1.5),
                        lambda c, a, b: torch.baddbmm(c, a, b, beta=-0.75, alpha=1.5), arrays, dtype, ulps=1,
                        values=normal)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_matmul_sums_broadcast_batches_before_rounding(dtype):
    # a's batch dim of 1 broadcasts against b's 2: its gradient sums two products. We sum them in float32 and round
    # once (bit-equal to the rounded float32 computation on dyadic inputs); torch rounds each product first, so
    # its gradient is within 1 ulp of the largest element of ours, not of each element
    rng = np.random.default_rng(3)
    arrays = [dyadic(rng, (3, 1, 6, 40), dtype), dyadic(rng, (2, 40, 5), dtype)]
    cotangent = cotangent_for(it.matmul, arrays, dyadic)
    ours, _ = outputs_and_grads(it, it.matmul, arrays, cotangent)
    assert_all_ulps(ours, float32_reference(torch.matmul, arrays, cotangent, dtype), dtype)
    theirs, _ = outputs_and_grads(torch, torch.matmul, arrays, cotangent)
    assert_all_ulps(ours, theirs, dtype, ulps=1, floor_fraction=1.0)
