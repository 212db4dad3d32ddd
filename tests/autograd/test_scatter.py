"""scatter / scatter_add / scatter_reduce / index_add / index_copy / index_fill / masked_scatter / take against
torch 2.13: values, gradients to self and src (repeated indices, every reduction, prod with zeros, amax ties),
second derivatives, the in-place forms (recorded), integer tensors and the errors."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op
from tests.torch_parity import same

RNG = np.random.default_rng(11)
X = RNG.standard_normal((3, 4)).astype(np.float32)
SRC = RNG.standard_normal((2, 4)).astype(np.float32)
IDX = np.array([[0, 1, 2, 0], [2, 1, 0, 0]])  # repeated positions in columns 0 and 1
ROWS = np.array([2, 0, 2])
V = RNG.standard_normal((3, 4)).astype(np.float32)
MASK = np.array([[True, False, True, False], [False, False, True, True], [True, False, False, False]])


def both(fn):
    return (lambda *xs: fn(it, *xs)), (lambda *xs: fn(torch, *xs))


CASES = {
    "scatter_add": lambda m, x, s: x.scatter_add(0, m.tensor(IDX), s),
    "scatter_add_dim1": lambda m, x, s: m.scatter_add(x, 1, m.tensor(IDX[:, :3]), s[:, :3]),
    "scatter_src": lambda m, x, s: x.scatter(0, m.tensor(IDX[:1]), s[:1]),
    "scatter_value": lambda m, x, s: x.scatter(1, m.tensor(IDX[:, :2]), 2.5) * s.sum(),
    "index_add": lambda m, x, s: x.index_add(0, m.tensor(ROWS), m.cat([s, s[:1]]) * 2, alpha=0.5),
    "index_add_dim1": lambda m, x, s: m.index_add(x, 1, m.tensor([3, 3]), s.t()[:3]),
    "index_copy": lambda m, x, s: x.index_copy(0, m.tensor([2, 0]), s),
    "index_fill": lambda m, x, s: x.index_fill(1, m.tensor([0, 3]), -1.0) * s.sum(),
    "masked_scatter": lambda m, x, s: x.masked_scatter(m.tensor(MASK), s),
    "take": lambda m, x, s: x.take(m.tensor([[0, 11], [5, -1]])) * s[0, :2],
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_torch(name):
    ours, theirs = both(CASES[name])
    check_op([X, SRC], ours, theirs, fd_tol=1e-5)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_matches_torch(reduce, include_self):
    x, src = X.copy(), SRC.copy()
    x[2, 2], src[0, 0] = 0.0, 0.0  # prod: a zero in self and one in src
    src[1, 3] = src[0, 3] = x[0, 3] = 1.25  # amax/amin: a tie between src values and self
    # (ties are not differentiable points: amax/amin are checked against torch, not finite differences)
    check_op([x, src], *both(lambda m, a, s: a.scatter_reduce(0, m.tensor(IDX), s, reduce,
                                                            include_self=include_self)),
             fd=reduce not in ("amax", "amin"), fd_tol=1e-5)


def test_scatter_reduce_prod_with_two_zeros_at_one_position():
    src = SRC.copy()
    src[0, 0] = src[1, 0] = 0.0  # both go to x[0, 0] and x[2, 0]: with IDX, (0, 0) and (2, 0)
    idx = np.array([[0, 1, 2, 0], [0, 1, 0, 0]])

    def run(m):
        x, s = m.tensor(X, requires_grad=True), m.tensor(src, requires_grad=True)
        out = x.scatter_reduce(0, m.tensor(idx), s, "prod")
        (out * m.tensor(V)).sum().backward()
        return out, x.grad, s.grad

    same(run)


@pytest.mark.parametrize("name", ["scatter_add", "scatter_src", "index_add", "index_copy", "masked_scatter", "take"])
def test_second_derivatives_match_torch(name):
    def run(m):
        x, s = m.tensor(X, requires_grad=True), m.tensor(SRC, requires_grad=True)
        out = CASES[name](m, x * x, s * s)
        gx, gs = m.autograd.grad((out * out).sum(), (x, s), create_graph=True)
        return gx, gs, m.autograd.grad((gx * m.tensor(V)).sum() + gs.sum(), (x, s))

    same(run, rtol=2e-5, atol=1e-5)


def test_in_place_forms_record_and_refuse_leaves():
    def run(m):
        x, s = m.tensor(X, requires_grad=True), m.tensor(SRC, requires_grad=True)
        y = x * 1
        y.scatter_add_(0, m.tensor(IDX), s).index_fill_(1, m.tensor([1]), 0.0)
        y.index_add_(0, m.tensor([1]), s[:1]).masked_scatter_(m.tensor(MASK), s * 2)
        y.scatter_(0, m.tensor(IDX[:1]), s[:1]).index_copy_(1, m.tensor([2]), s[:, :1].repeat(2, 1)[:3])
        y.scatter_reduce_(1, m.tensor(IDX[:, :3]), s[:, :3], "amax")
        (y * m.tensor(V)).sum().backward()
        return y, x.grad, s.grad

    same(run)
    leaf = it.tensor(X, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        leaf.scatter_add_(0, it.tensor(IDX), it.tensor(SRC))
    with it.no_grad():
        leaf.index_fill_(0, it.tensor([0]), 7.0)  # allowed without grad, as torch
    assert leaf[0].tolist() == [7.0] * 4


def test_integer_tensors():
    ints = np.arange(12).reshape(3, 4)
    same(lambda m: (m.tensor(ints).scatter_add(0, m.tensor(IDX), m.tensor(ints[:2])),
                    m.tensor(ints).scatter(1, m.tensor(IDX[:, :2]), 99),
                    m.tensor(ints).scatter_reduce(0, m.tensor(IDX), m.tensor(ints[:2]) + 1, "mean"),
                    m.tensor(ints).scatter_reduce(0, m.tensor(IDX), m.tensor(ints[:2]), "amin", include_self=False),
                    m.tensor(ints).index_add(1, m.tensor([0, 0]), m.tensor(ints[:, :2])),
                    m.tensor(ints).take(m.tensor([3, 7]))))


def test_deprecated_reduce_argument_warns_like_torch():
    with pytest.warns(UserWarning, match="scatter_reduce"):
        ours = it.tensor(X).scatter(0, it.tensor(IDX), it.tensor(SRC), reduce="multiply")
    with pytest.warns(UserWarning):
        theirs = torch.tensor(X).scatter(0, torch.tensor(IDX), torch.tensor(SRC), reduce="multiply")
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


@pytest.mark.parametrize("call,message", [
    (lambda x: x.scatter_add(0, it.tensor([[3, 0, 0, 0]]), it.tensor(SRC)),
     r"scatter_add: expected indices in \[0, 3\)"),
    (lambda x: x.scatter_add(0, it.tensor(IDX.astype(np.float32)), it.tensor(SRC)), "an integer"),
    (lambda x: x.scatter_add(0, it.tensor(IDX), it.tensor(SRC).double()), "src of the tensor's dtype"),
    (lambda x: x.scatter_add(0, it.tensor([0, 1]), it.tensor(SRC)), "an index with as many dims"),
    (lambda x: x.scatter_reduce(0, it.tensor(IDX), it.tensor(SRC), "max"), "reduce in"),
    (lambda x: x.index_add(0, it.tensor([0]), it.tensor(SRC)), r"index_add: expected a source of shape \(1, 4\)"),
    (lambda x: x.index_copy(1, it.tensor([4]), it.tensor(X[:, :1])), r"index_copy: expected indices in \[-4, 4\)"),
    (lambda x: x.masked_scatter(it.tensor(MASK), it.tensor(SRC[:1])), "at least 5 elements"),
    (lambda x: x.take(it.tensor([12])), r"take: expected indices in \[-12, 12\)"),
])
def test_errors_name_the_op(call, message):
    with pytest.raises(ValueError, match=message):
        call(it.tensor(X))
