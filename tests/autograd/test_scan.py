import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

SHAPES = [((5,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), -1), ((2, 3, 4), 1), ((), 0), ((), -1), ((0, 3), 1),
          ((3, 1), 1)]


@pytest.mark.parametrize("shape,dim", SHAPES, ids=str)
@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_matches_torch(name, shape, dim):
    check_op([shape], lambda x: getattr(it, name)(x, dim), lambda x: getattr(torch, name)(x, dim), atol=1e-5)


@pytest.mark.parametrize("data", [
    [2.0, 0.0, 3.0, 0.0, 5.0],  # two zeros
    [0.0, 2.0, 3.0, 4.0, 5.0],  # a zero first
    [2.0, 3.0, 0.0, 4.0, 5.0],  # one zero inside
    [2.0, 3.0, 4.0, 5.0, 0.0],  # a zero last
    [0.0, 0.0, 0.0],
    [[1.5, 0.0, 2.0, -1.0], [0.0, 3.0, 0.0, 2.0], [1.0, 2.0, 3.0, 4.0]],  # rows with and without zeros
], ids=str)
def test_cumprod_gradient_with_zeros_matches_torch(data):
    x = np.array(data, np.float32)
    # fd: finite differences are exact too, cumprod is polynomial in each input
    check_op([x], lambda t: it.cumprod(t, -1), lambda t: torch.cumprod(t, -1), grad_mask=[True], fd_tol=1e-5)


def test_cumprod_gradient_with_a_zero_by_hand():
    x = it.tensor([2.0, 0.0, 3.0, 0.0, 5.0], requires_grad=True)
    it.autograd.backward([it.cumprod(x, 0)], [it.tensor([1.0, 2.0, 3.0, 4.0, 5.0])])
    # x0: g0 * 1 (all later outputs are 0); x1: x0 * (g1 + g2 * x2) = 2 * (2 + 9); the rest: 0
    assert x.grad.tolist() == [1.0, 22.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_integer_and_bool_inputs_give_int64(name, dtype):
    data = torch.tensor([1, 2, 0, 3]).to(dtype)
    expect = getattr(torch, name)(data, 0)
    got = getattr(it, name)(it.tensor(data.numpy()), 0)
    assert got.dtype == it.int64 and expect.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), expect.numpy())


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_dtype_casts_the_input_first(name):
    data = torch.tensor([1.7, 2.6, 3.2])
    for it_dtype, th_dtype in [(it.int32, torch.int32), (it.float64, torch.float64), ("int16", torch.int16)]:
        got = getattr(it, name)(it.tensor(data.numpy()), 0, dtype=it_dtype)
        expect = getattr(torch, name)(data, 0, dtype=th_dtype)
        assert str(got.dtype) == str(expect.dtype).split(".")[1]
        np.testing.assert_array_equal(got.numpy(), expect.numpy())  # int32: [1, 3, 6], not a rounded [1, 4, 7]


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_gradient_comes_back_in_the_input_dtype(name):
    x = it.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = getattr(it, name)(x, 0, dtype=it.float64)
    assert y.dtype == it.float64
    y.sum().backward()
    expect_x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    getattr(torch, name)(expect_x, 0, dtype=torch.float64).sum().backward()
    assert x.grad.dtype == it.float32
    np.testing.assert_allclose(x.grad.numpy(), expect_x.grad.numpy())


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
def test_scan_dim_errors(name):
    with pytest.raises(ValueError, match=rf"{name}: expected dim in \[-2, 1\] for a 2-D tensor, got dim=2"):
        getattr(it, name)(it.ones(2, 3), 2)
    with pytest.raises(ValueError, match=rf"{name}: expected dim in \[-1, 0\] for a 0-D tensor, got dim=1"):
        getattr(it, name)(it.ones(()), 1)
