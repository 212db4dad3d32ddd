import pytest
import torch

import infini_train as it
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
    with pytest.raises(ValueError, match="matmul: expected operands of one dtype"):
        it.ones(2, 3) @ it.ones(3, 2, dtype=it.float64)
