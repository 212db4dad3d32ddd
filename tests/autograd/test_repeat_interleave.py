"""repeat_interleave's gradients against torch 2.13: first and second derivatives (create_graph=True) for an int
count, a tensor of counts (zeros included) and the flattened form, and float64 finite differences."""
import numpy as np
import pytest

from tests.op_check import check_op
from tests.torch_parity import same

RNG = np.random.default_rng(21)
X = RNG.standard_normal((3, 4))
V = RNG.standard_normal((3, 4))

CASES = {
    "int_dim0": lambda m, x: x.repeat_interleave(2, 0), "int_dim1": lambda m, x: m.repeat_interleave(x, 3, dim=-1),
    "flattened": lambda m, x: x.repeat_interleave(2), "zero": lambda m, x: x.repeat_interleave(0, 1),
    "counts_dim0": lambda m, x: x.repeat_interleave(m.tensor([2, 0, 3]), 0),
    "counts_dim1": lambda m, x: m.repeat_interleave(x, m.tensor([1, 3, 0, 2]), dim=1, output_size=6),
    "one_count": lambda m, x: x.repeat_interleave(m.tensor([2]), 1),
    "counts_flat": lambda m, x: x.repeat_interleave(m.tensor(np.arange(12) % 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_second_derivatives_match_torch(name):
    def run(m):
        x = m.tensor(X, requires_grad=True)
        out = CASES[name](m, x * x)
        (g,) = m.autograd.grad((out * out * out).sum(), x, create_graph=True)
        (gg,) = m.autograd.grad((g * m.tensor(V)).sum(), x)
        return out, g, gg

    same(run, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_values_gradients_and_finite_differences(name):
    check_op([X.shape], lambda x: CASES[name](__import__("infini_train"), x),
             lambda x: CASES[name](__import__("torch"), x), fd_tol=1e-5)
