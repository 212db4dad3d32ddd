import re

import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("shapes", [[(3,), (4,)], [(1,), (5,)], [(0,), (3,)], [(3,), (0,)]], ids=str)
def test_outer(shapes):
    check_op(shapes, it.outer, torch.outer)


def test_outer_gradient_to_one_side_only():
    check_op([(3,), (4,)], it.outer, torch.outer, grad_mask=[True, False])
    check_op([(3,), (4,)], it.outer, torch.outer, grad_mask=[False, True])


def test_outer_values():
    out = it.outer(it.tensor([1.0, 2.0]), it.tensor([3.0, 4.0, 5.0]))
    np.testing.assert_array_equal(out.numpy(), [[3, 4, 5], [6, 8, 10]])
    assert it.outer(it.arange(3), it.arange(2)).dtype == it.int64


@pytest.mark.parametrize("a,b,got", [((2, 3), (3,), "2-D a of shape (2, 3)"), ((3,), (), "0-D b of shape ()")],
                         ids=str)
def test_outer_rejects_non_vectors(a, b, got):
    with pytest.raises(ValueError, match=rf"(?s)Outer: expected 1-D tensors for a and b, got {re.escape(got)}.*HINT"):
        it.outer(it.ones(*a), it.ones(*b))


def test_outer_rejects_python_scalars():
    with pytest.raises(ValueError, match="Outer: expected two 1-D Tensors, got Tensor and float"):
        it.outer(it.ones(3), 2.0)
