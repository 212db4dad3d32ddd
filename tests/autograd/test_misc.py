import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("spec,dim", [(2, 0), ([1, 3], 1), (3, -1)])
def test_split(spec, dim):
    check_op([(4, 4)], lambda x: it.split(x, spec, dim), lambda x: torch.split(x, spec, dim))


def test_split_with_unused_outputs_gets_zero_grads():
    check_op([(6, 2)], lambda x: it.split(x, 2)[1] * 3, lambda x: torch.split(x, 2)[1] * 3)


@pytest.mark.parametrize("n,chunks", [(6, 3), (7, 3), (5, 4)])
def test_chunk_uneven(n, chunks):
    check_op([(n, 2)], lambda x: x.chunk(chunks), lambda x: x.chunk(chunks))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack(dim):
    check_op([(2, 3), (2, 3), (2, 3)], lambda a, b, c: it.cat([a, b, c], dim),
             lambda a, b, c: torch.cat([a, b, c], dim))
    check_op([(2, 3), (2, 3)], lambda a, b: it.stack([a, b], dim), lambda a, b: torch.stack([a, b], dim))
    check_op([(2, 3), (1, 3)], lambda a, b: it.concat([a, b], 0), lambda a, b: torch.cat([a, b], 0))


@pytest.mark.parametrize("index", [
    (slice(None), 1), (0,), (slice(1, None, 2),), (Ellipsis, -1), (None, slice(0, 2)), (1, slice(None), None),
], ids=str)
def test_basic_indexing(index):
    check_op([(3, 4, 2)], lambda x: x[index], lambda x: x[index])


def test_advanced_indexing_with_repeated_indices_accumulates():
    idx = np.array([0, 2, 0, 0], np.int64)
    check_op([(3, 2), idx], lambda x, i: x[i], lambda x, i: x[i])
    check_op([(3, 4)], lambda x: x[[1, 1, 2], [0, 0, 3]], lambda x: x[[1, 1, 2], [0, 0, 3]])
    check_op([(3, 4), idx[:3]], lambda x, i: x[:, i], lambda x, i: x[:, i])


def test_bool_mask_indexing():
    mask = np.array([[True, False, True], [False, False, True]])
    check_op([(2, 3), mask], lambda x, m: x[m], lambda x, m: x[m])


def test_gather_and_index_select_with_repeats():
    index = np.array([[0, 0, 2], [1, 1, 1]], np.int64)
    check_op([(2, 3), index], lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i))
    check_op([(3, 2), np.array([[2, 0], [2, 2]], np.int64)], lambda x, i: it.gather(x, 0, i),
             lambda x, i: torch.gather(x, 0, i))
    sel = np.array([2, 0, 2], np.int64)
    check_op([(3, 4), sel], lambda x, i: it.index_select(x, 0, i), lambda x, i: torch.index_select(x, 0, i))
    check_op([(3, 4), sel], lambda x, i: it.index_select(x, 1, i), lambda x, i: torch.index_select(x, 1, i))


def test_errors_name_op_and_values():
    with pytest.raises(ValueError, match=r"cat: expected equal shapes except in dim 0, got tensor 0 has shape "
                                         r"\(2, 3\), tensor 1 has shape \(2, 4\)"):
        it.cat([it.ones(2, 3), it.ones(2, 4)])
    with pytest.raises(ValueError, match="gather: expected indices in \\[0, 3\\)"):
        it.gather(it.ones(2, 3), 1, it.tensor([[0, 5]]))
    with pytest.raises(ValueError, match="getitem: expected indices within the shape"):
        it.ones(2, 3)[5]
    with pytest.raises(ValueError, match="split: expected sections summing"):
        it.split(it.ones(4), [1, 2])
