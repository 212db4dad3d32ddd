import pytest

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True),
                                         ((0, 2), False)])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_sum_mean(name, dim, keepdim):
    it_fn = (lambda x: getattr(x, name)()) if dim is None else (lambda x: getattr(x, name)(dim, keepdim))
    th_fn = (lambda x: getattr(x, name)()) if dim is None else (lambda x: getattr(x, name)(dim, keepdim))
    check_op([(2, 3, 4)], it_fn, th_fn)


def test_sum_of_0d_and_empty():
    check_op([()], lambda x: x.sum(), lambda x: x.sum())
    check_op([(0, 3)], lambda x: x.sum(0), lambda x: x.sum(0))


def test_reduction_dim_out_of_range():
    with pytest.raises((IndexError, ValueError), match="dim 3 is out of range"):
        it.ones(2, 3).sum(3)
