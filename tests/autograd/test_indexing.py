import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.indexing import index_add
from tests.op_check import check_op


# ------------------------------------------------------------------------------------ basic indexing
@pytest.mark.parametrize("index", [
    (slice(None), 1), (0,), 2, -1, (slice(1, None, 2),), (Ellipsis, -1), (None, slice(0, 2)),
    (1, slice(None), None), (slice(None), slice(None, None, 3), 0), (-2, -1, 1), (), Ellipsis,
    (slice(5, 9),), (Ellipsis, None, slice(None, 1)),
], ids=str)
def test_basic_indexing(index):
    check_op([(3, 4, 2)], lambda x: x[index] * 2, lambda x: x[index] * 2)


def test_basic_indexing_is_a_view_and_negative_steps_work():
    x = it.randn(3, 4)
    for y in (x[1:, ::2], x[1], x[1, 2], x[None]):
        assert np.shares_memory(y.array, x.array) and y._version is x._version
    check_op([(3, 4)], lambda x: x[::-1, 1::-1] * 2, lambda x: x.flip(0)[:, :2].flip(1) * 2)
    check_op([()], lambda x: x[...] * 2, lambda x: x[...] * 2)
    check_op([()], lambda x: x[None] * 2, lambda x: x[None] * 2)


# --------------------------------------------------------------------------------- advanced indexing
REPEATED = np.array([0, 2, 0, 0], np.int64)


@pytest.mark.parametrize("make", [
    lambda i: i,  # int array / Tensor with repeats
    lambda i: (slice(None), i[:3]),  # mixed with a slice
    lambda i: (i[:2] - 3,),  # negative indices
    lambda i: (i.reshape(2, 2),),  # 2-D index array
    lambda i: ([1, 1, 2], [0, 0, 1]),  # Python lists, repeated pairs
    lambda i: (i[:2], slice(None), [1, 1]),  # arrays split by a slice: advanced dims move to the front
    lambda i: (Ellipsis, [1, 0, 1]),
    lambda i: (None, [2, 2], 1),
], ids=["array", "slice+array", "negative", "2d", "lists", "split", "ellipsis", "none+int"])
def test_advanced_indexing_with_repeated_indices_accumulates(make):
    index = make(REPEATED)
    check_op([(3, 4, 2)], lambda x: x[index] * 2, lambda x: x[index] * 2)
    it_index = tuple(it.tensor(i) if isinstance(i, np.ndarray) else i for i in index) \
        if isinstance(index, tuple) else it.tensor(index)
    th_index = tuple(torch.tensor(i) if isinstance(i, np.ndarray) else i for i in index) \
        if isinstance(index, tuple) else torch.tensor(index)
    check_op([(3, 4, 2)], lambda x: x[it_index], lambda x: x[th_index], fd=False)


def test_index_tensor_passed_through_check_op():
    check_op([(3, 2), REPEATED], lambda x, i: x[i], lambda x, i: x[i])
    check_op([(3, 4), REPEATED[:3]], lambda x, i: x[:, i] * 2, lambda x, i: x[:, i] * 2)
    check_op([(3, 4)], lambda x: x[[]], lambda x: x[[]])


MASK = np.array([[True, False, True], [False, False, True]])


@pytest.mark.parametrize("shape,mask,lead", [
    ((2, 3), MASK, 0),  # full mask
    ((2, 3, 2), MASK, 0),  # mask over the two leading dims
    ((3, 2, 3), MASK, 1),  # mask after a slice: x[:, mask]
    ((3, 2), np.array([True, False, True]), 0),
    ((3, 2), np.zeros(3, bool), 0),  # selects nothing
], ids=["full", "leading", "after-slice", "1d", "none"])
def test_bool_mask_indexing(shape, mask, lead):
    prefix = (slice(None),) * lead
    check_op([shape, mask], lambda x, m: x[prefix + (m,)] * 2, lambda x, m: x[prefix + (m,)] * 2)


def test_indexing_errors_name_getitem_the_index_and_the_size():
    x = it.ones(2, 3)
    with pytest.raises(ValueError, match=r"getitem: expected indices in \[-2, 2\) for dim 0 of size 2, got index 5"):
        x[5]
    with pytest.raises(ValueError, match=r"getitem: expected indices in \[-3, 3\) for dim 1 of size 3, got index -4"):
        x[:, -4]
    with pytest.raises(ValueError, match=r"getitem: expected indices in \[-3, 3\) for dim 1 of size 3, got index 7"):
        x[[0, 1], it.tensor([2, 7])]
    with pytest.raises(ValueError, match=r"getitem: expected a bool mask of shape \(2, 3\) \(dims 0..\), got a mask "
                                         r"of shape \(3, 2\)"):
        x[it.tensor(np.ones((3, 2), bool))]
    with pytest.raises(ValueError, match=r"getitem: expected at most 2 indices for shape \(2, 3\), got 3 indices"):
        x[0, 0, 0]
    with pytest.raises(ValueError, match="getitem: expected integer or bool index arrays, got an index of dtype "
                                         "float32"):
        x[it.tensor([0.0, 1.0])]


def test_index_add_accumulates_repeats():
    target = np.zeros((3, 2), np.float32)
    index_add(np, target, np.array([0, 0, 2]), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(target, [[2, 2], [0, 0], [1, 1]])


# ------------------------------------------------------------------------------- gather/index_select
@pytest.mark.parametrize("shape,dim,index", [
    ((2, 3), 1, [[0, 0, 2], [1, 1, 1]]),
    ((3, 2), 0, [[2, 0], [2, 2]]),
    ((2, 3, 4), -1, [[[3, 3, 0]], [[1, 1, 1]]]),  # smaller than the input in dims 1 and 2
    ((2, 3, 4), 1, [[[2, 2], [0, 2], [1, 1], [2, 0]], [[0, 0], [0, 0], [1, 2], [2, 2]]]),
    ((4,), 0, [3, 3, 3, 1, 0]),
    ((2, 3), 1, np.zeros((2, 0), np.int64)),
], ids=str)
def test_gather_with_repeats(shape, dim, index):
    index = np.asarray(index, np.int64)
    if shape == (2, 3, 4) and dim == 1:
        index = index.transpose(0, 2, 1)  # (2, 2, 4): along dim 1 pick 2 of 3
    check_op([shape, index], lambda x, i: x.gather(dim, i) * 2, lambda x, i: x.gather(dim, i) * 2)
    check_op([shape, index], lambda x, i: it.gather(x, dim, i), lambda x, i: torch.gather(x, dim, i), fd=False)


@pytest.mark.parametrize("shape,dim,index", [((3, 4), 0, [2, 0, 2]), ((3, 4), 1, [3, 3, 0, 1, 3]),
                                             ((2, 3, 2), -1, [1, 1]), ((3, 2), 0, 1), ((3, 2), 0, [])], ids=str)
def test_index_select_with_repeats(shape, dim, index):
    index = np.asarray(index, np.int64)
    check_op([shape, index], lambda x, i: it.index_select(x, dim, i) * 2,
             lambda x, i: torch.index_select(x, dim, i) * 2)


def test_gather_index_select_errors_name_the_index_and_size():
    with pytest.raises(ValueError, match=r"gather: expected indices in \[0, 3\) for dim 1 of size 3, got index 5"):
        it.gather(it.ones(2, 3), 1, it.tensor([[0, 5]]))
    with pytest.raises(ValueError, match=r"gather: expected indices in \[0, 2\) for dim 0 of size 2, got index -1"):
        it.ones(2, 3).gather(0, it.tensor([[-1, 0]]))
    with pytest.raises(ValueError, match=r"gather: expected index sizes <= the input's \(2, 3\) in every dim but 1"):
        it.ones(2, 3).gather(1, it.tensor(np.zeros((3, 1), np.int64)))
    with pytest.raises(ValueError, match="gather: expected an integer index with 2 dims"):
        it.ones(2, 3).gather(1, it.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"index_select: expected indices in \[0, 3\) for dim 0 of size 3, got "
                                         r"index 3"):
        it.index_select(it.ones(3, 2), 0, it.tensor([0, 3]))
