import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((6,), (2, 1, 3)), ((), (1,))])
def test_reshape_and_view(shape, new):
    check_op([shape], lambda x: x.reshape(new) * 2, lambda x: x.reshape(new) * 2)
    check_op([shape], lambda x: x.view(*new) * 2, lambda x: x.view(*new) * 2)


@pytest.mark.parametrize("d0,d1", [(0, 1), (0, 2), (-1, -2)])
def test_transpose(d0, d1):
    check_op([(2, 3, 4)], lambda x: x.transpose(d0, d1) * 2, lambda x: x.transpose(d0, d1) * 2)


def test_reshape_bad_size_is_clear():
    with pytest.raises(ValueError, match=r"(?s)reshape: expected a shape holding the input's 6 elements, got shape "
                                         r"\(4, 2\) \(8 elements\).*HINT"):
        it.ones(2, 3).reshape(4, 2)
    with pytest.raises(ValueError, match=r"(?s)view: .*at most one -1"):
        it.ones(2, 3).view(-1, -1)


# ------------------------------------------------------------------------------------------- permute
@pytest.mark.parametrize("shape,dims", [((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (-1, 0, -2)), ((2, 3), (1, 0)),
                                        ((0, 3), (1, 0)), ((), ())], ids=str)
def test_permute(shape, dims):
    check_op([shape], lambda x: x.permute(dims) * 2, lambda x: x.permute(dims) * 2)
    check_op([shape], lambda x: it.permute(x, dims) * 2, lambda x: torch.permute(x, dims) * 2, fd=False)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (5,)], ids=str)
def test_T_reverses_all_dims(shape):
    check_op([shape], lambda x: x.T * 2, lambda x: x.permute(*reversed(range(x.ndim))) * 2)


def test_permute_is_a_view_and_rejects_bad_dims():
    x = it.randn(2, 3, 4)
    y = x.permute(2, 0, 1)
    assert np.shares_memory(y.array, x.array) and y._version is x._version
    with pytest.raises(ValueError, match=r"permute: expected a permutation of the 3 dims, got dims=\(0, 0, 1\)"):
        x.permute(0, 0, 1)
    with pytest.raises(ValueError, match="permute: expected dim in"):
        x.permute(0, 1, 3)


# -------------------------------------------------------------------------------------------- expand
@pytest.mark.parametrize("shape,new", [((3, 1), (3, 4)), ((3, 1), (-1, 4)), ((1,), (2, 3, 5)),
                                       ((2, 1, 3), (4, 2, -1, 3)), ((), (2, 3)), ((0, 1), (0, 3)),
                                       ((2, 3), (2, 3))], ids=str)
def test_expand(shape, new):
    check_op([shape], lambda x: x.expand(*new) * 1.5, lambda x: x.expand(*new) * 1.5)


def test_expand_is_a_broadcast_view_and_errors_are_clear():
    x = it.randn(3, 1)
    y = x.expand(2, 3, 4)
    assert y.shape == (2, 3, 4) and y.array.strides[0] == 0 and y.array.strides[2] == 0
    assert np.shares_memory(y.array, x.array) and y._version is x._version
    assert it.expand(x, (3, 4)).shape == (3, 4)
    with pytest.raises(ValueError, match=r"expand: expected size 3 or any size where the input has 1 \(dim 0\)"):
        x.expand(4, 4)
    with pytest.raises(ValueError, match="expand: expected sizes >= 0 for new leading dims, got -1 at dim 0"):
        x.expand(-1, 3, 4)
    with pytest.raises(ValueError, match="expand: expected at least 2 sizes"):
        x.expand(3)


# --------------------------------------------------------------------------------- squeeze/unsqueeze
@pytest.mark.parametrize("shape,dim", [((1, 3, 1, 2), None), ((1, 3, 1, 2), 0), ((1, 3, 1, 2), -2),
                                       ((1, 3, 1, 2), 1), ((1, 3, 1, 2), (0, 2)), ((1, 3, 1, 2), (-1, -2)),
                                       ((), None), ((), 0), ((1, 0), None), ((1, 0), 1)], ids=str)
def test_squeeze(shape, dim):
    if dim is None:
        check_op([shape], lambda x: x.squeeze() * 2, lambda x: x.squeeze() * 2)
    else:
        check_op([shape], lambda x: x.squeeze(dim) * 2, lambda x: x.squeeze(dim) * 2)


@pytest.mark.parametrize("shape,dim", [((2, 3), 0), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0), ((), -1),
                                       ((0, 2), 1)], ids=str)
def test_unsqueeze(shape, dim):
    check_op([shape], lambda x: x.unsqueeze(dim) * 2, lambda x: x.unsqueeze(dim) * 2)


def test_squeeze_unsqueeze_out_of_range_dims():
    with pytest.raises(ValueError, match=r"squeeze: expected dim in \[-2, 1\] for a 2-d tensor, got dim=2"):
        it.ones(1, 2).squeeze(2)
    with pytest.raises(ValueError, match=r"unsqueeze: expected dim in \[-3, 2\]"):
        it.ones(1, 2).unsqueeze(3)
    y = it.ones(1, 2).unsqueeze(1)
    assert y.shape == (1, 1, 2)


# ------------------------------------------------------------------------------------------- flatten
@pytest.mark.parametrize("shape,start,end", [((2, 3, 4), 0, -1), ((2, 3, 4), 1, 2), ((2, 3, 4), 0, 1),
                                             ((2, 3, 4), -2, -1), ((2, 3, 4), 1, 1), ((), 0, -1),
                                             ((2, 0, 3), 0, 1)], ids=str)
def test_flatten(shape, start, end):
    check_op([shape], lambda x: x.flatten(start, end) * 2, lambda x: x.flatten(start, end) * 2)
    check_op([shape], lambda x: it.flatten(x, start, end), lambda x: torch.flatten(x, start, end), fd=False)


def test_flatten_start_after_end_is_clear():
    with pytest.raises(ValueError, match="flatten: expected start_dim <= end_dim, got start_dim=2, end_dim=0"):
        it.ones(2, 3, 4).flatten(2, 0)


# ------------------------------------------------------------------------------------------ tril/triu
@pytest.mark.parametrize("shape,k", [((4, 5), 0), ((4, 5), 1), ((4, 5), -1), ((2, 3, 4, 4), 2), ((2, 3, 4, 4), -2),
                                     ((3, 2, 5), -3), ((3, 5, 2), 4), ((0, 3, 3), 0)], ids=str)
def test_tril_triu_batched(shape, k):
    check_op([shape], lambda x: x.tril(k) * 2, lambda x: x.tril(k) * 2)
    check_op([shape], lambda x: it.triu(x, k) * 2, lambda x: torch.triu(x, k) * 2)


def test_tril_needs_two_dims_and_keeps_int_dtype():
    with pytest.raises(ValueError, match=r"tril: expected a tensor with at least 2 dims .*got shape \(3,\)"):
        it.ones(3).tril()
    ints = it.tensor(np.arange(9).reshape(3, 3))
    np.testing.assert_array_equal(ints.triu(1).numpy(), np.triu(np.arange(9).reshape(3, 3), 1))
    assert ints.triu(1).grad_fn is None


# --------------------------------------------------------------------------------------- masked_fill
MASKS = [
    ((2, 3, 4), np.array([[True], [False], [True]])),  # (3, 1) broadcast over dims 0 and 2
    ((2, 3, 4), np.random.default_rng(0).random((2, 3, 4)) > 0.5),  # full-shape mask
    ((3, 4), np.array([False, True, True, False])),  # trailing-dim mask
    ((3, 4), np.array(True)),  # 0-d mask fills everything
    ((), np.array(False)),
]


@pytest.mark.parametrize("shape,mask", MASKS, ids=lambda v: str(getattr(v, "shape", v)))
def test_masked_fill_broadcasting_mask(shape, mask):
    check_op([shape, mask], lambda x, m: x.masked_fill(m, 5.0) * 2, lambda x, m: x.masked_fill(m, 5.0) * 2)


def test_masked_fill_gradient_is_zero_where_masked_and_inf_fill():
    mask = np.array([[True, False, False], [False, False, True]])
    x = it.randn(2, 3, requires_grad=True)
    x.masked_fill(it.tensor(mask), 7).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), (~mask).astype(np.float32))
    check_op([(2, 3), mask], lambda x, m: x.masked_fill(m, float("-inf")).softmax(-1),
             lambda x, m: x.masked_fill(m, float("-inf")).softmax(-1), fd=False)


def test_masked_fill_with_0d_tensor_value_gets_gradient():
    mask = np.array([[True, False, True], [False, False, True]])
    check_op([(2, 3), mask, ()], lambda x, m, v: it.masked_fill(x, m, v) * 3,
             lambda x, m, v: torch.masked_fill(x, m, v) * 3)


def test_masked_fill_errors():
    with pytest.raises(ValueError, match="masked_fill: expected a bool mask, got a mask of dtype int64"):
        it.ones(2, 3).masked_fill(it.tensor([1, 0, 1]), 0.0)
    with pytest.raises(ValueError, match=r"masked_fill: expected a mask broadcastable to the input's shape \(2, 3\)"):
        it.ones(2, 3).masked_fill(it.tensor(np.ones((4, 2, 3), bool)), 0.0)
    with pytest.raises(ValueError, match=r"masked_fill: expected a Python scalar or a 0-d tensor"):
        it.ones(2, 3).masked_fill(it.tensor(np.ones(3, bool)), it.ones(3))


# --------------------------------------------------------------------------------- repeat_interleave
@pytest.mark.parametrize("shape,repeats,dim", [((2, 3), 2, 0), ((2, 3), 3, -1), ((2, 3), 2, None), ((2, 3), 0, 1),
                                               ((), 3, None), ((2, 0), 2, 1)], ids=str)
def test_repeat_interleave_int(shape, repeats, dim):
    check_op([shape], lambda x: x.repeat_interleave(repeats, dim), lambda x: x.repeat_interleave(repeats, dim))


@pytest.mark.parametrize("shape,repeats,dim", [((2, 3), [1, 0, 3], 1), ((3, 2), [2, 2, 1], 0),
                                               ((2, 2), [3, 0, 1, 2], None), ((2, 3, 2), [2, 1, 2], -2),
                                               ((3, 2), [4], 0)], ids=str)
def test_repeat_interleave_tensor_repeats(shape, repeats, dim):
    reps = np.array(repeats, np.int64)
    check_op([shape, reps], lambda x, r: x.repeat_interleave(r, dim), lambda x, r: x.repeat_interleave(r, dim))


def test_repeat_interleave_errors():
    with pytest.raises(ValueError, match=r"repeat_interleave: expected 3 repeats \(one per entry of dim 1\), got 2"):
        it.ones(2, 3).repeat_interleave(it.tensor([1, 2]), 1)
    with pytest.raises(ValueError, match="repeat_interleave: expected non-negative repeats"):
        it.ones(2, 3).repeat_interleave(-1, 0)


# ---------------------------------------------------------------------------------------- contiguous
def test_contiguous():
    x = it.randn(3, 4)
    assert x.contiguous() is x  # already contiguous: no copy, like torch
    check_op([(3, 4)], lambda x: x.T.contiguous() * 2, lambda x: x.T.contiguous() * 2)
    check_op([(2, 3, 4)], lambda x: x[:, ::2].contiguous(), lambda x: x[:, ::2].contiguous())
    y = it.randn(3, 4, requires_grad=True)
    c = y.T.contiguous()
    assert c.array.flags.c_contiguous and not np.shares_memory(c.array, y.array)
    assert it.contiguous(it.ones(())).shape == ()
