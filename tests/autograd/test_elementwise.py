import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

BINARY_SHAPES = [
    [(3, 4), (3, 4)],
    [(2, 3, 4), (4,)],  # broadcast trailing
    [(3, 1), (1, 4)],  # broadcast both
    [(), (2, 3)],  # 0-d with matrix
    [(0, 3), (3,)],  # empty
]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_binary_ops(name, shapes):
    check_op(shapes, getattr(it, name), getattr(torch, name))


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
def test_div(shapes):
    # denominators kept away from zero
    check_op(shapes, lambda a, b: a / (b * b + 1), lambda a, b: a / (b * b + 1))


@pytest.mark.parametrize("scalar", [2.5, -3, 0.5])
def test_ops_with_python_scalars_on_either_side(scalar):
    check_op([(2, 3)], lambda a: (a + scalar) * scalar - scalar / (a * a + 1) + (scalar - a),
             lambda a: (a + scalar) * scalar - scalar / (a * a + 1) + (scalar - a))


@pytest.mark.parametrize("shape", [(3, 4), (), (0,)], ids=str)
@pytest.mark.parametrize("name", ["neg", "exp", "tanh"])
def test_unary(name, shape):
    check_op([shape], getattr(it, name), getattr(torch, name))


def test_log():
    check_op([(3, 4)], it.log, torch.log, low=0.5, high=3.0)


@pytest.mark.parametrize("exponent", [2, 3.0, 0.5, -1.5, 0])
def test_pow_scalar_exponent(exponent):
    check_op([(3, 4)], lambda a: a ** exponent, lambda a: a ** exponent, low=0.5, high=2.0)


def test_pow_scalar_base_and_tensor_exponent():
    check_op([(3, 4)], lambda b: 2.0 ** b, lambda b: 2.0 ** b)
    check_op([(3, 4), (4,)], lambda a, b: a ** b, lambda a, b: a ** b, low=0.5, high=2.0)


def test_pow_grad_at_zero_base_matches_torch():
    check_op([np.array([0.0, 1.0, 2.0], np.float32), (3,)], lambda a, b: a ** (b * b + 1),
             lambda a, b: a ** (b * b + 1), fd=False)


def test_integer_tensor_with_float_scalar_stays_float32():
    out = it.arange(4) * 0.5
    assert out.dtype == it.float32
    np.testing.assert_allclose(out.numpy(), [0.0, 0.5, 1.0, 1.5])


def test_shape_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"(?s)Add: .*\(2, 3\).*\(4,\)"):
        it.ones(2, 3) + it.ones(4)


def test_device_mismatch_names_the_op_and_devices():
    msg = "Mul: expected all tensor inputs on one device, got inputs on cpu:1 and cpu:2"
    with pytest.raises(ValueError, match=msg):
        it.ones(2, device="cpu:1") * it.ones(2, device="cpu:2")


# ---------------------------------------------------------------------------------------- unary math
UNARY_SHAPES = [(3, 4), (), (0, 2)]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_cos(name, shape):
    check_op([shape], getattr(it, name), getattr(torch, name))
    check_op([shape], lambda x: getattr(x, name)(), lambda x: getattr(x, name)())


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["sqrt", "rsqrt", "reciprocal"])
def test_positive_domain_unary(name, shape):
    # inputs kept away from 0, where these functions and their gradients blow up
    check_op([shape], getattr(it, name), getattr(torch, name), low=0.5, high=3.0)
    check_op([shape], lambda x: getattr(x, name)(), lambda x: getattr(x, name)(), low=0.5, high=3.0)


def test_reciprocal_of_negative_values():
    check_op([(2, 3)], it.reciprocal, torch.reciprocal, low=-3.0, high=-0.5)


def test_abs_away_from_zero():
    x = np.array([[-1.5, -0.3, 0.4], [2.0, -0.01, 0.7]], np.float32)
    check_op([x], it.abs, torch.abs)
    check_op([x], lambda t: t.abs(), lambda t: t.abs())
    check_op([()], it.abs, torch.abs)


def test_abs_gradient_at_zero_is_zero_like_torch():
    # the kink: finite differences would average the two slopes, so compare with torch only
    check_op([np.array([-1.0, 0.0, 2.0], np.float32)], it.abs, torch.abs, fd=False)


def test_float_math_on_integer_tensor_gives_float32():
    x = it.arange(1, 5)
    for name in ["sqrt", "rsqrt", "sin", "cos", "reciprocal", "exp", "log"]:
        out = getattr(it, name)(x)
        assert out.dtype == it.float32, name
        np.testing.assert_allclose(out.numpy(), getattr(torch, name)(torch.arange(1, 5)).numpy(), rtol=1e-6)
    assert it.abs(it.arange(-2, 2)).dtype == it.int64


# ---------------------------------------------------------------------------------------------- clamp
@pytest.mark.parametrize("lo,hi", [(-0.5, None), (None, 0.7), (-0.5, 0.7), (0.5, -0.5)], ids=str)
@pytest.mark.parametrize("shape", [(3, 4), (), (0, 3)], ids=str)
def test_clamp_scalar_bounds(shape, lo, hi):
    check_op([shape], lambda x: x.clamp(lo, hi), lambda x: x.clamp(lo, hi))
    check_op([shape], lambda x: it.clamp(x, min=lo, max=hi), lambda x: torch.clamp(x, min=lo, max=hi))


def test_clamp_gradient_passes_at_the_bounds_like_torch():
    # x equal to a bound keeps its gradient (min <= x <= max); FD is undefined at the kink
    x = np.array([-1.0, -0.5, 0.0, 0.7, 1.0], np.float32)
    check_op([x], lambda t: t.clamp(-0.5, 0.7), lambda t: t.clamp(-0.5, 0.7), fd=False)
    check_op([x], lambda t: t.clamp(min=0.0), lambda t: t.clamp(min=0.0), fd=False)


@pytest.mark.parametrize("shapes", [[(3, 4), (4,), (3, 1)], [(2, 4), (), (4,)]], ids=str)
def test_clamp_tensor_bounds_with_broadcasting(shapes):
    check_op(shapes, lambda x, lo, hi: it.clamp(x, lo, hi + 1), lambda x, lo, hi: torch.clamp(x, lo, hi + 1))
    check_op(shapes[:2], lambda x, lo: x.clamp(min=lo), lambda x, lo: x.clamp(min=lo))
    check_op(shapes[:2], lambda x, hi: x.clamp(max=hi), lambda x, hi: x.clamp(max=hi))


def test_clamp_needs_a_bound():
    with pytest.raises(ValueError, match="(?s)Clamp: expected at least one of min and max.*HINT"):
        it.ones(2).clamp()


def test_clamp_integer_tensor():
    np.testing.assert_array_equal(it.arange(5).clamp(1, 3).numpy(), [1, 1, 2, 3, 3])
    assert it.arange(5).clamp(1, 3).dtype == it.int64
    assert it.arange(5).clamp(min=0.5).dtype == it.float32


# ---------------------------------------------------------------------------------- maximum / minimum
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum(name, shapes):
    check_op(shapes, getattr(it, name), getattr(torch, name))


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_with_scalars_on_either_side(name):
    it_fn, th_fn = getattr(it, name), getattr(torch, name)
    check_op([(3, 4)], lambda a: it_fn(a, 0.25), lambda a: th_fn(a, torch.tensor(0.25)))
    check_op([(3, 4)], lambda a: it_fn(-0.25, a), lambda a: th_fn(torch.tensor(-0.25), a))
    check_op([(3, 4)], lambda a: a.maximum(0.5) if name == "maximum" else a.minimum(0.5),
             lambda a: th_fn(a, torch.tensor(0.5)))


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_ties_split_the_gradient(name):
    # ties: torch gives each side half the gradient; FD is undefined there, so compare with torch only
    a = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]], np.float32)
    b = np.array([[1.0, 1.0, 5.0], [0.5, 0.0, 4.0]], np.float32)
    check_op([a, b], getattr(it, name), getattr(torch, name), fd=False)
    check_op([a, np.array([1.0, 0.0, 4.0], np.float32)], getattr(it, name), getattr(torch, name), fd=False)
    x = it.tensor([1.0, 2.0, 3.0], requires_grad=True)
    getattr(it, name)(x, 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 1.0] if name == "maximum" else [1.0, 0.5, 0.0])


# ------------------------------------------------------------------------------- comparisons and logic
COMPARE = [("eq", "__eq__"), ("ne", "__ne__"), ("lt", "__lt__"), ("le", "__le__"), ("gt", "__gt__"),
           ("ge", "__ge__")]


@pytest.mark.parametrize("name,dunder", COMPARE)
def test_comparisons_match_torch(name, dunder):
    rng = np.random.default_rng(0)
    a = rng.integers(-2, 3, size=(3, 4)).astype(np.float32)  # small integers: plenty of equal pairs
    pairs = [(a, rng.integers(-2, 3, size=(3, 4)).astype(np.float32)),
             (a, rng.integers(-2, 3, size=(4,)).astype(np.float32)),  # broadcasting
             (np.array(1.0, np.float32), a),  # 0-d
             (np.zeros((0, 4), np.float32), a[0])]  # empty
    for x, y in pairs:
        check_op([x, y], getattr(it, name), getattr(torch, name), grad=False)
        check_op([x, y], lambda u, v: getattr(u, dunder)(v), lambda u, v: getattr(u, dunder)(v), grad=False)
    # Python scalars on either side
    check_op([a], lambda x: getattr(it, name)(x, 1), lambda x: getattr(torch, name)(x, 1), grad=False)
    check_op([a], lambda x: getattr(x, dunder)(0.0), lambda x: getattr(x, dunder)(0.0), grad=False)


def test_scalar_on_the_left_of_comparison_operators():
    x = it.tensor([0.0, 1.0, 2.0])
    np.testing.assert_array_equal((1 < x).numpy(), [False, False, True])
    np.testing.assert_array_equal((1 >= x).numpy(), [True, True, False])
    np.testing.assert_array_equal((1 == x).numpy(), [False, True, False])
    np.testing.assert_array_equal(it.lt(1, x).numpy(), [False, False, True])


def test_comparison_results_are_bool_and_carry_no_gradient():
    x = it.randn(3, requires_grad=True)
    for out in [x > 0, x == x, it.ge(x, 0.0), ~(x > 0), (x > 0) & (x < 1), (x > 0) | (x < 1)]:
        assert out.dtype == it.bool
        assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("name,op", [("logical_and", "__and__"), ("logical_or", "__or__")])
def test_logical_binary(name, op):
    rng = np.random.default_rng(1)
    a = rng.random((3, 4)) > 0.5
    for x, y in [(a, rng.random((3, 4)) > 0.5), (a, rng.random((4,)) > 0.5), (np.array(True), a),
                 (np.zeros((0, 4), bool), a[0])]:
        check_op([x, y], getattr(it, name), getattr(torch, name), grad=False)
        check_op([x, y], lambda u, v: getattr(u, op)(v), lambda u, v: getattr(u, op)(v), grad=False)
    # non-bool inputs use their truth values, as torch.logical_*
    check_op([np.array([0.0, 2.0, -1.0, 0.0], np.float32), np.array([0.0, 0.0, 3.0, 1.0], np.float32)],
             getattr(it, name), getattr(torch, name), grad=False)


def test_logical_not():
    rng = np.random.default_rng(2)
    for a in [rng.random((3, 4)) > 0.5, np.array(False), np.zeros((0,), bool)]:
        check_op([a], it.logical_not, torch.logical_not, grad=False)
        check_op([a], lambda x: ~x, lambda x: ~x, grad=False)
    check_op([np.array([0.0, 1.5, -2.0], np.float32)], it.logical_not, torch.logical_not, grad=False)


# ---------------------------------------------------------------------------------------------- where
WHERE_SHAPES = [
    [(3, 4), (3, 4), (3, 4)],
    [(3, 1), (1, 4), (4,)],  # all three broadcast
    [(2, 3, 4), (4,), ()],
    [(), (2, 3), (2, 3)],  # 0-d condition
    [(0, 3), (3,), (0, 3)],  # empty
]


@pytest.mark.parametrize("shapes", WHERE_SHAPES, ids=str)
def test_where(shapes):
    cond = np.random.default_rng(3).random(shapes[0]) > 0.5
    cond = np.asarray(cond)
    check_op([cond, shapes[1], shapes[2]], it.where, torch.where)


def test_where_with_scalars_on_either_side():
    cond = np.array([[True, False, True], [False, False, True]])
    check_op([cond, (2, 3)], lambda c, a: it.where(c, a, 0.5), lambda c, a: torch.where(c, a, 0.5))
    check_op([cond, (3,)], lambda c, b: it.where(c, -1.0, b), lambda c, b: torch.where(c, -1.0, b))
    out = it.where(it.tensor(cond), 1.0, 0)
    assert out.dtype == it.float32
    np.testing.assert_array_equal(out.numpy(), cond.astype(np.float32))


def test_where_needs_a_bool_condition():
    with pytest.raises(ValueError, match="(?s)Where: expected a bool condition tensor.*float32.*HINT"):
        it.where(it.ones(3), it.ones(3), it.zeros(3))
    with pytest.raises(ValueError, match="Where: expected the condition as a bool Tensor"):
        it.where(True, it.ones(3), it.zeros(3))
