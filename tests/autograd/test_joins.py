import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


# --------------------------------------------------------------------------------------- split/chunk
@pytest.mark.parametrize("shape,spec,dim", [((4, 4), 2, 0), ((4, 4), [1, 3], 1), ((4, 3), 3, -1),
                                            ((5, 3), 2, 0), ((2, 5), [1, 0, 3, 1], -1), ((0, 3), 2, 0),
                                            ((3, 2), 5, 0)], ids=str)
def test_split(shape, spec, dim):
    check_op([shape], lambda x: it.split(x, spec, dim), lambda x: torch.split(x, spec, dim))
    check_op([shape], lambda x: x.split(spec, dim), lambda x: x.split(spec, dim), fd=False)


def test_split_with_missing_output_grads_gets_zeros():
    # only outputs 0 and 2 of 3 are used: the engine feeds zeros for the middle one
    check_op([(7, 2)], lambda x: (lambda a, b, c: a * 3 + c[:1].sum())(*it.split(x, 3)),
             lambda x: (lambda a, b, c: a * 3 + c[:1].sum())(*torch.split(x, 3)))
    x = it.randn(6, 2, requires_grad=True)
    pieces = x.split([2, 3, 1])
    (pieces[1] * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.repeat([[0.0], [2.0], [0.0]], [2, 3, 1], axis=0) * [1, 1])


def test_split_pieces_are_views_sharing_the_version():
    x = it.randn(4, 3)
    a, b = x.split(2)
    assert np.shares_memory(a.array, x.array) and a._version is x._version and b._version is x._version


@pytest.mark.parametrize("n,chunks", [(6, 3), (7, 3), (5, 4), (6, 4), (2, 5), (0, 3)])
def test_chunk_uneven_matches_torch(n, chunks):
    check_op([(n, 2)], lambda x: x.chunk(chunks), lambda x: x.chunk(chunks))
    check_op([(2, n)], lambda x: it.chunk(x, chunks, -1), lambda x: torch.chunk(x, chunks, -1), fd=False)


def test_split_chunk_errors():
    with pytest.raises(ValueError, match=r"split: expected non-negative sections summing to the size of dim 0 \(4\)"):
        it.split(it.ones(4), [1, 2])
    with pytest.raises(ValueError, match="split: expected a positive split size, got 0"):
        it.split(it.ones(4), 0)
    with pytest.raises(ValueError, match="chunk: expected a positive number of chunks, got 0"):
        it.ones(4).chunk(0)
    with pytest.raises(ValueError, match=r"split: expected dim in \[-1, 0\], got dim=1"):
        it.ones(4).split(2, 1)


# ---------------------------------------------------------------------------------------- cat/stack
@pytest.mark.parametrize("shapes,dim", [([(2, 3), (4, 3), (1, 3)], 0), ([(2, 1, 4), (2, 3, 4), (2, 2, 4)], -2),
                                        ([(2, 3), (2, 1), (2, 2), (2, 4)], 1), ([(0, 3), (2, 3)], 0),
                                        ([(3,)], 0), ([(2, 2, 1), (2, 2, 3)], -1)], ids=str)
def test_cat_several_sizes_along_dim(shapes, dim):
    check_op(shapes, lambda *xs: it.cat(xs, dim) * 2, lambda *xs: torch.cat(xs, dim) * 2)
    check_op(shapes, lambda *xs: it.concat(list(xs), dim), lambda *xs: torch.concat(xs, dim), fd=False)


def test_cat_with_an_input_that_needs_no_grad():
    check_op([(2, 3), (1, 3), (3, 3)], lambda a, b, c: it.cat([a, b, c]), lambda a, b, c: torch.cat([a, b, c]),
             grad_mask=[True, False, True])


@pytest.mark.parametrize("shape,dim", [((2, 3), 0), ((2, 3), 1), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0),
                                       ((0, 2), 1)], ids=str)
def test_stack(shape, dim):
    check_op([shape] * 3, lambda *xs: it.stack(xs, dim) * 2, lambda *xs: torch.stack(xs, dim) * 2)


def test_cat_stack_errors_name_the_tensor_and_shapes():
    with pytest.raises(ValueError, match=r"cat: expected equal shapes except in dim 0, got tensor 0 has shape "
                                         r"\(2, 3\), tensor 2 has shape \(2, 4\)\nHINT: "):
        it.cat([it.ones(2, 3), it.ones(1, 3), it.ones(2, 4)])
    with pytest.raises(ValueError, match=r"cat: expected equal shapes except in dim 1, got tensor 0 has shape "
                                         r"\(2, 3\), tensor 1 has shape \(2, 3, 1\)"):
        it.cat([it.ones(2, 3), it.ones(2, 3, 1)], dim=-1)
    with pytest.raises(ValueError, match=r"stack: expected tensors on one device, got tensor 0 on cpu, tensor 1 "
                                         r"on cpu:1\nHINT: move"):
        it.stack([it.ones(2, device="cpu:0"), it.ones(2, device="cpu:1")])
    with pytest.raises(ValueError, match=r"stack: expected tensors of equal shape, got tensor 0 has shape \(2,\), "
                                         r"tensor 1 has shape \(3,\)\nHINT: .*use cat"):
        it.stack([it.ones(2), it.ones(3)])
    with pytest.raises(ValueError, match="cat: expected tensors with at least 1 dim, got a 0-d tensor"):
        it.cat([it.ones(()), it.ones(())])
    with pytest.raises(ValueError, match="cat: expected a non-empty sequence of tensors"):
        it.cat([])
    with pytest.raises(ValueError, match=r"stack: expected dim in \[-2, 1\], got dim=2"):
        it.stack([it.ones(2), it.ones(2)], 2)
