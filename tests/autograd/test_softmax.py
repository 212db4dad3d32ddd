import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family(name, dim):
    check_op([(3, 4, 5)], lambda x: getattr(it, name)(x, dim), lambda x: getattr(torch, name)(x, dim))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_rows_of_plus_minus_1e4_are_finite_and_match_torch(name):
    rows = np.array([[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, 1e4, -1e4]], np.float32)
    check_op([rows], lambda x: getattr(it, name)(x, -1), lambda x: getattr(torch, name)(x, -1), fd=False)
    out = getattr(it, name)(it.tensor(rows), -1).numpy()
    assert np.isfinite(out).all()


def test_tensor_methods_and_empty():
    check_op([(2, 3)], lambda x: x.softmax(-1), lambda x: x.softmax(-1))
    check_op([(0, 3)], lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1))
