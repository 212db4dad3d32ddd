"""nonzero (and as_tuple), argwhere, count_nonzero, where(cond) and unique against torch 2.13, for float, integer
and bool tensors, 0-d and empty inputs, and indexing with the results."""
import numpy as np
import pytest

import infini_train as it
from tests.torch_parity import same

A = np.array([[0.0, 1.5, 0.0], [-2.0, 0.0, 3.0]], np.float32)
B = np.array([[3, 1, 3, 0], [2, 1, 3, 3], [0, 0, 2, 1]])


def test_nonzero_argwhere_count_nonzero_and_where_match_torch():
    same(lambda m: (m.tensor(A).nonzero(), m.nonzero(m.tensor(A), as_tuple=True), m.argwhere(m.tensor(B)),
                    m.tensor(B > 1).nonzero(), m.tensor(A).count_nonzero(), m.count_nonzero(m.tensor(B), 0),
                    m.tensor(B).count_nonzero((0, 1)), m.where(m.tensor(A) != 0), m.where(m.tensor(B) == 3)))


def test_zero_d_and_empty_inputs():
    same(lambda m: (m.tensor(5.0).nonzero(), m.tensor(0.0).nonzero(), m.tensor(5.0).nonzero(as_tuple=True),
                    m.zeros(0, 3).nonzero(), m.zeros(2, 3).nonzero(as_tuple=True), m.tensor(0).count_nonzero()))


def test_indexing_with_the_results_selects_the_nonzero_values():
    def run(m):
        x = m.tensor(A, requires_grad=True)
        picked = x[x.nonzero(as_tuple=True)]
        (picked * picked).sum().backward()
        return picked, x.grad

    same(run)


@pytest.mark.parametrize("kwargs", [{}, {"return_inverse": True}, {"return_counts": True},
                                    {"return_inverse": True, "return_counts": True}, {"dim": 0},
                                    {"dim": 1, "return_inverse": True, "return_counts": True}])
def test_unique_matches_torch(kwargs):
    same(lambda m: m.unique(m.tensor(B), **kwargs))
    same(lambda m: m.tensor(A).unique(sorted=True, **kwargs))


def test_results_carry_no_gradient():
    x = it.tensor(A, requires_grad=True)
    assert not x.nonzero().requires_grad and not x.unique().requires_grad and not x.count_nonzero().requires_grad


def test_errors():
    with pytest.raises(ValueError, match=r"count_nonzero: expected dims in \[-2, 1\]"):
        it.tensor(A).count_nonzero(2)
    with pytest.raises(ValueError, match=r"unique: expected dim in \[-2, 1\] or None"):
        it.tensor(A).unique(dim=5)
