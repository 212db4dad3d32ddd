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
