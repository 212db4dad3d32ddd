"""Reductions at their edges, against torch 2.13: an empty dim list ((), []) reduces every dim for sum, mean,
var, std, nansum, nanmean and the norms (and no dim for all/any); logsumexp over an empty slice is -inf;
vector_norm refuses integer inputs (dtype= or not) and the orders with no value over zero elements; fmod_ in
place; every reordering and statistics error carries a HINT line."""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import assert_same, same

RNG = np.random.default_rng(11)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
NAN = np.where(RNG.random(X.shape) < 0.3, np.nan, X).astype(np.float32)

EVERY_DIM = {
    "sum": lambda m, x, d: x.sum(d), "sum_keep": lambda m, x, d: m.sum(x, d, keepdim=True),
    "mean": lambda m, x, d: x.mean(d), "var": lambda m, x, d: x.var(d), "std": lambda m, x, d: m.std(x, d),
    "var_kw": lambda m, x, d: x.var(dim=d, correction=0), "var_mean": lambda m, x, d: m.var_mean(x, d),
    "std_mean": lambda m, x, d: m.std_mean(x, d, keepdim=True),
    "nansum": lambda m, x, d: m.nansum(x * m.tensor(np.where(np.isnan(NAN), np.nan, 1).astype(np.float32)), d),
    "nanmean": lambda m, x, d: (x * m.tensor(np.where(np.isnan(NAN), np.nan, 1).astype(np.float32))).nanmean(d),
    "norm": lambda m, x, d: x.norm(dim=d), "norm_p3": lambda m, x, d: m.norm(x, 3, d, True),
    "vector_norm": lambda m, x, d: m.linalg.vector_norm(x, 1, d),
}


@pytest.mark.parametrize("empty", [(), []], ids=["tuple", "list"])
@pytest.mark.parametrize("name", list(EVERY_DIM))
def test_an_empty_dim_list_reduces_every_dim(name, empty):
    """Ours with dim=() against torch with dim=None. torch's forward reads () as every dim (checked here too), but
    its var/std backward for () divides by the wrong count (inf), so the gradients are those of dim=None."""
    def run(m, dim):
        x = m.tensor(X, requires_grad=True)
        out = EVERY_DIM[name](m, x, dim)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.sum() * (k + 1) for k, o in enumerate(outs)).backward()
        return out, x.grad

    ours, theirs = run(it, empty), run(torch, None)
    assert_same(ours, theirs, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(EVERY_DIM[name](torch, torch.tensor(X), empty), theirs[0], equal_nan=True)


def test_all_and_any_read_an_empty_dim_list_as_no_dim():
    flags = X > 0
    same(lambda m: (m.tensor(flags).all(()), m.tensor(flags).any([]), m.tensor(flags).all(()).shape))


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), ((0, 2), False), (-3, True)])
def test_logsumexp_of_an_empty_slice_is_minus_infinity(dim, keepdim):
    def run(m):
        x = m.tensor(np.zeros((0, 3, 2), np.float32), requires_grad=True)
        out = m.logsumexp(x, dim, keepdim)
        (out.masked_fill(out.isinf(), 0.0) * 2).sum().backward()
        return out, x.grad

    same(run)


def test_logsumexp_over_an_empty_dim_list_is_refused_as_torch_refuses_it():
    with pytest.raises(RuntimeError):
        torch.logsumexp(torch.tensor(X), ())
    with pytest.raises(ValueError, match=r"logsumexp: expected dim as an int or a non-empty tuple of dims, got "
                                         r"dim=\(\)\nHINT: pass dim=tuple\(range\(x.ndim\)\)"):
        it.logsumexp(it.tensor(X), ())


@pytest.mark.parametrize("call", [
    lambda m: m.linalg.vector_norm(m.tensor([1, 2]), dtype=m.float32),
    lambda m: m.tensor([1, 2]).norm(dtype=m.float64),
    lambda m: m.linalg.vector_norm(m.zeros(0, 3), math.inf, dim=0),
    lambda m: m.linalg.vector_norm(m.zeros(0, 3), -math.inf, dim=(0, 1)),
    lambda m: m.linalg.vector_norm(m.zeros(0, 3), -1, dim=0),
    lambda m: m.linalg.vector_norm(m.zeros(0), math.inf),
    lambda m: m.norm(m.zeros(2, 0), float("inf"), dim=1),
])
def test_vector_norm_refuses_what_torch_refuses(call):
    with pytest.raises(RuntimeError):
        call(torch)
    with pytest.raises(ValueError, match=r"vector_norm: expected (a floating-point input|non-empty reduced dims)"
                                         r"[^\n]*\nHINT: "):
        call(it)


def test_vector_norm_over_empty_dims_where_torch_gives_a_value():
    same(lambda m: (m.linalg.vector_norm(m.zeros(0, 3), 2, dim=0), m.linalg.vector_norm(m.zeros(0, 3), 0, dim=0),
                    m.linalg.vector_norm(m.zeros(0, 3), math.inf, dim=1), m.linalg.vector_norm(m.zeros(0)),
                    m.linalg.vector_norm(m.zeros(0, 3), -2, dim=1)))


def test_fmod_in_place_matches_torch_with_gradients():
    a = (X * 5).astype(np.float32)
    b = (np.abs(X) + 0.5).astype(np.float32)

    def run(m):
        x, y = m.tensor(a, requires_grad=True), m.tensor(b, requires_grad=True)
        z = x * 1.0
        z.fmod_(y)
        (z * z).sum().backward()
        ints = m.tensor([[-7, 7], [5, -5]])
        ints.fmod_(3)
        return z, x.grad, y.grad, ints

    same(run, rtol=1e-5, atol=1e-5)


def test_fmod_in_place_refuses_a_leaf_and_an_integer_zero():
    with pytest.raises(RuntimeError, match="fmod_: a leaf tensor that requires grad"):
        it.tensor(X, requires_grad=True).fmod_(2.0)
    with pytest.raises(ZeroDivisionError, match="fmod"):
        it.tensor([1, 2]).fmod_(0)


@pytest.mark.parametrize("call", [
    lambda: it.tensor(X).flip(0, 0), lambda: it.tensor(X).flip(3), lambda: it.tensor(X).roll((1, 2), 0),
    lambda: it.tensor(X).roll((1, 2)), lambda: it.tensor(X).rot90(1, (0,)), lambda: it.tensor(1.0).rot90(),
    lambda: it.tensor([1.0]).fliplr(), lambda: it.tensor(1.0).flipud(), lambda: it.tensor(1.0).unbind(),
    lambda: it.tensor(1.0).diff(), lambda: it.tensor(X).diff(-1), lambda: it.diff(it.tensor(X), prepend=1.0),
    lambda: it.tensor(X).var(False, True), lambda: it.tensor(X).var(0, True, correction=1),
    lambda: it.tensor(X).prod((0, 1)), lambda: it.tensor([1, 2]).nanmean(), lambda: it.tensor(X).norm("nuc"),
    lambda: it.linalg.vector_norm(it.tensor(X), "fro"),
])
def test_every_error_names_what_was_expected_and_received_with_a_hint(call):
    with pytest.raises(ValueError) as info:
        call()
    first, hint = str(info.value).split("\n")
    assert ": expected " in first and ", got " in first and hint.startswith("HINT: ") and len(hint) > 10


def test_the_zero_norm_has_no_gradient_as_torch():
    def run(m):
        x = m.tensor([1.0, 0.0, -2.0], requires_grad=True)
        x.norm(0).backward()
        lone = x.grad
        y = m.tensor([1.0, 0.0, -2.0], requires_grad=True)
        (m.linalg.vector_norm(y, 0) + y.sum()).backward()
        z = m.tensor([1.0, 0.0], requires_grad=True)
        return lone is None, y.grad, m.autograd.grad(z.norm(0), z, allow_unused=True)[0] is None

    assert same(run)[0] is True
