import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.padding import pad
from tests.op_check import check_op

F = torch.nn.functional


@pytest.mark.parametrize("shape,padding", [
    ((3,), (1, 2)), ((2, 3), (2, 0)), ((2, 3, 4), (1, 1, 0, 2)), ((2, 3, 4), (0, 0, 0, 0, 1, 1)),
    ((2, 5), (-1, -2)), ((2, 5), (-1, 2, 1, -1)), ((2, 3), (-1, -2)), ((2, 3), (-3, 2)), ((), ()),
    ((0, 3), (1, 1, 2, 0)), ((2, 3, 4), (2, 1)),
], ids=str)
def test_constant_pad_matches_torch(shape, padding):
    check_op([shape], lambda x: pad(x, padding), lambda x: F.pad(x, padding))
    check_op([shape], lambda x: pad(x, padding, value=1.5), lambda x: F.pad(x, padding, value=1.5))


def test_constant_pad_casts_the_value_to_integer_dtypes():
    x = torch.tensor([1, 2, 3])
    got = pad(it.tensor(x.numpy()), (1, 1), value=-1.5)
    assert got.dtype == it.int64
    np.testing.assert_array_equal(got.numpy(), F.pad(x, (1, 1), value=-1.5).numpy())
    np.testing.assert_array_equal(got.numpy(), [-1, 1, 2, 3, -1])


SHAPES = [
    ((2, 5), (2, 3)),  # (C, W)
    ((2, 3, 5), (1, 4)),  # (N, C, W)
    ((3, 4, 5), (2, 1, 3, 0)),  # (C, H, W)
    ((2, 2, 4, 5), (1, 2, 3, 1)),  # (N, C, H, W)
    ((2, 3, 4, 5), (1, 2, 1, 1, 2, 0)),  # (C, D, H, W)
    ((1, 2, 3, 4, 5), (2, 1, 0, 2, 1, 1)),  # (N, C, D, H, W)
    ((2, 5), (-1, 2)), ((2, 5), (2, -1)), ((2, 5), (-2, -1)),  # negative pads crop
    ((2, 3, 4), (0, 0, 1, -2)), ((2, 3, 4), (-1, 0, -1, 1)),
]


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,padding", SHAPES, ids=str)
def test_non_constant_modes_match_torch(mode, shape, padding):
    check_op([shape], lambda x: pad(x, padding, mode), lambda x: F.pad(x, padding, mode=mode))


@pytest.mark.parametrize("mode,padding", [
    ("replicate", (6, 7)), ("replicate", (-4, 4)), ("replicate", (4, -4)), ("circular", (3, 3)),
    ("circular", (-1, -2)), ("reflect", (2, 2)), ("circular", (0, 0)),
], ids=str)
def test_edge_sized_pads_match_torch(mode, padding):
    check_op([(2, 3)], lambda x: pad(x, padding, mode), lambda x: F.pad(x, padding, mode=mode))


def test_pad_values_by_hand():
    x = it.tensor([[0.0, 1.0, 2.0, 3.0]])
    assert pad(x, (2, 1), "reflect").tolist() == [[2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]]
    assert pad(x, (2, 1), "replicate").tolist() == [[0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0]]
    assert pad(x, (2, 1), "circular").tolist() == [[2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0]]
    assert pad(x, (2, -1), "circular").tolist() == [[1.0, 2.0, 0.0, 1.0, 2.0]]  # crops first, then wraps
    assert pad(x, (-1, 1), value=9.0).tolist() == [[1.0, 2.0, 3.0, 9.0]]


def test_replicate_gradient_gathers_on_the_edge():
    x = it.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    pad(x, (2, 3), "replicate").sum().backward()
    assert x.grad.tolist() == [[3.0, 1.0, 4.0]]


def test_empty_batch_and_channels():
    check_op([(0, 2, 3)], lambda x: pad(x, (1, 1), "reflect"), lambda x: F.pad(x, (1, 1), mode="reflect"))
    check_op([(2, 0, 3)], lambda x: pad(x, (1, 1), "circular"), lambda x: F.pad(x, (1, 1), mode="circular"))


@pytest.mark.parametrize("shape,padding,mode,kwargs,message", [
    ((2, 3), (1,), "constant", {}, "pad: expected a padding length divisible by 2, got 1 values"),
    ((2, 3), (1, 1, 1, 1, 1, 1), "constant", {}, "pad: expected at most 4 padding values .* for a 2-D input"),
    ((2, 3), (1.0, 1), "constant", {}, "pad: expected pad as a tuple of ints"),
    ((2, 3), (-2, -2), "constant", {}, r"pad: expected negative pads that crop at most the size of dim 1 \(3\)"),
    ((2, 3), (1, 1), "foo", {}, "pad: expected mode in"),
    ((2, 3), (1, 1), "reflect", {"value": 1.0}, "pad: expected no fill value for mode 'reflect'"),
    ((3,), (1, 1), "reflect", {}, "pad: expected a 2-D or 3-D input for 2 padding values in mode 'reflect', got a 1-D"),
    ((2, 2, 2, 3), (1, 1), "replicate", {}, "expected a 2-D or 3-D input for 2 padding values"),
    ((2, 3), (1, 1, 1, 1), "circular", {}, "expected a 3-D or 4-D input for 4 padding values"),
    ((2, 2, 2, 2, 2, 2), (1,) * 6, "reflect", {}, "expected a 4-D or 5-D input for 6 padding values"),
    ((2, 3), (), "reflect", {}, "expected a 1-D or 2-D input for 0 padding values"),
    ((2, 3), (3, 0), "reflect", {}, r"pad: expected reflect padding smaller than the size of dim 1 \(3\)"),
    ((2, 3), (0, 4), "reflect", {}, "reflect padding smaller"),
    ((2, 3), (-1, -2), "reflect", {}, "pad: expected an output size of at least 1 in dim 1, got 0"),
    ((2, 3), (-2, -2), "replicate", {}, "pad: expected an output size of at least 1 in dim 1, got -1"),
    ((2, 3), (-2, -2), "circular", {}, "pad: expected an output size of at least 0 in dim 1, got -1"),
    ((2, 3), (4, 0), "circular", {}, r"pad: expected circular padding of at most the size of dim 1 \(3 after"),
    ((2, 3), (3, -1), "circular", {}, r"of at most the size of dim 1 \(2 after cropping\)"),
    ((0, 3), (1, 1), "reflect", {}, "pad: expected non-zero sizes in every dim but the batch dim"),
    ((2, 0, 3), (1, 1), "replicate", {}, "expected non-zero sizes in every dim but the batch dim"),
], ids=str)
def test_pad_errors(shape, padding, mode, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pad(it.ones(*shape), padding, mode, **kwargs)
    if "after cropping" not in message:  # torch accepts that one and reads unset memory
        with pytest.raises((RuntimeError, NotImplementedError, TypeError)):
            F.pad(torch.ones(*shape), padding, mode=mode, **kwargs)


def test_pad_is_not_a_top_level_function():
    assert not hasattr(it, "pad")
