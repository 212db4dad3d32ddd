"""prod, var/std with ``unbiased``, var_mean/std_mean, nansum/nanmean, logsumexp, norms and fmod against torch 2.13:
values, dtypes, gradients (prod with one and several zeros), second derivatives, float64 finite differences, and
prod under CPU autocast."""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op
from tests.torch_parity import same

RNG = np.random.default_rng(9)
X = RNG.uniform(0.5, 1.5, (3, 4)).astype(np.float32) * np.where(RNG.random((3, 4)) < 0.5, -1, 1).astype(np.float32)
V = RNG.standard_normal((3, 4)).astype(np.float32)
NAN_AT = np.array([[True, False, False, False], [False, False, True, True], [False, False, False, False]])


def both(fn):
    return (lambda *xs: fn(it, *xs)), (lambda *xs: fn(torch, *xs))


CASES = {
    "prod_all": lambda m, x: x.prod(), "prod_dim": lambda m, x: m.prod(x, 1), "prod_keep": lambda m, x: x.prod(0, True),
    "var_unbiased_false": lambda m, x: x.var(1, False), "var_positional_keepdim": lambda m, x: x.var(0, True, True),
    "var_kw": lambda m, x: m.var(x, unbiased=False), "var_bool_first": lambda m, x: x.var(False),
    "std_unbiased": lambda m, x: x.std(dim=1, unbiased=True, keepdim=True), "std_correction": lambda m, x:
        x.std(0, correction=0),
    "var_mean": lambda m, x: m.var_mean(x, 1, unbiased=False), "std_mean": lambda m, x: m.std_mean(x, dim=0),
    "nansum": lambda m, x: m.nansum(x.masked_fill(m.tensor(NAN_AT), float("nan")), 1),
    "nanmean": lambda m, x: x.masked_fill(m.tensor(NAN_AT), float("nan")).nanmean(0, keepdim=True),
    "logsumexp": lambda m, x: m.logsumexp(x * 3, 1), "logsumexp_keep": lambda m, x: x.logsumexp((0, 1), True),
    "norm": lambda m, x: x.norm(), "norm_dim": lambda m, x: m.norm(x, dim=1), "norm_p1": lambda m, x: x.norm(1, 0),
    "norm_p3": lambda m, x: x.norm(3), "norm_inf": lambda m, x: x.norm(float("inf"), 1),
    "vector_norm": lambda m, x: m.linalg.vector_norm(x, 2, (0, 1), True),
    "vector_norm_ninf": lambda m, x: m.linalg.vector_norm(x, -math.inf),
    "fmod": lambda m, x: m.fmod(x * 5, x.abs() + 0.5), "fmod_scalar": lambda m, x: (x * 7).fmod(1.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_torch(name):
    ours, theirs = both(CASES[name])
    check_op([X.shape], ours, theirs, fd_tol=2e-5, low=0.5, high=1.5)


@pytest.mark.parametrize("zeros", [[(1, 2)], [(1, 0), (1, 3)], [(0, 0), (2, 1)], [(0, 1), (0, 2), (0, 3)]])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_prod_gradient_is_exact_with_zeros(zeros, dim):
    x = X.copy()
    for i, j in zeros:
        x[i, j] = 0.0

    def run(m):
        t = m.tensor(x, requires_grad=True)
        out = t.prod() if dim is None else t.prod(dim)
        (out * m.ones(out.shape) * 1.5).sum().backward()
        return out, t.grad

    same(run)


@pytest.mark.parametrize("name", ["prod_dim", "prod_all", "var_mean", "logsumexp", "norm_dim", "norm_p3", "fmod"])
def test_second_derivatives_match_torch(name):
    def run(m):
        x = m.tensor(X, requires_grad=True)
        out = CASES[name](m, x)
        out = out[0] * out[1] if isinstance(out, tuple) else out
        (g,) = m.autograd.grad((out * out).sum(), x, create_graph=True)
        (gg,) = m.autograd.grad((g * m.tensor(V)).sum(), x)
        return g, gg

    same(run, rtol=5e-5, atol=1e-5)


def test_prod_second_derivative_with_a_zero():
    x = X.copy()
    x[1, 1] = 0.0

    def run(m):
        t = m.tensor(x, requires_grad=True)
        (g,) = m.autograd.grad(t.prod(1).sum(), t, create_graph=True)
        (gg,) = m.autograd.grad((g * m.tensor(V)).sum(), t)
        return g, gg

    same(run)


def test_integer_inputs_and_dtypes():
    ints = np.array([[1, 2, 3], [4, 0, 6]])
    same(lambda m: (m.tensor(ints).prod(), m.tensor(ints).prod(1), m.tensor(ints > 0).prod(0),
                    m.tensor(ints).prod(dtype=m.float64), m.tensor(ints).nansum(), m.logsumexp(m.tensor(ints), 1),
                    m.fmod(m.tensor(ints), 4), m.fmod(m.tensor([-7, 7]), m.tensor([3, -3]))))


def test_special_values():
    same(lambda m: (m.logsumexp(m.tensor([[-math.inf, -math.inf], [math.inf, 1.0]]), 1),
                    m.tensor([[float("nan"), float("nan")], [1.0, float("nan")]]).nanmean(1),
                    m.tensor([0.0, 0.0]).norm(), m.tensor([3.0, -4.0]).norm(0)))
    x = it.tensor([0.0, 0.0], requires_grad=True)
    x.norm().backward()
    assert x.grad.tolist() == [0.0, 0.0]  # torch: zero where the norm is zero


def test_prod_runs_in_float32_under_cpu_autocast():
    def run(m):
        x = m.tensor(X, dtype=m.bfloat16)
        with m.autocast("cpu", dtype=m.bfloat16):
            return x.prod(1), x.prod()

    ours = same(run, rtol=1e-2, atol=1e-2)
    assert ours[0].dtype == it.float32


@pytest.mark.parametrize("call,error,message", [
    (lambda: it.tensor([1, 2]).fmod(0), ZeroDivisionError, "fmod: integer division by zero"),
    (lambda: it.tensor(X).var(0, True, correction=1), ValueError, "var: expected either unbiased or correction"),
    (lambda: it.tensor(X).norm("nuc"), ValueError, "norm: expected p='fro' or a number"),
    (lambda: it.tensor([1, 2]).nanmean(), ValueError, "nanmean: expected a floating-point input"),
    (lambda: it.tensor(X).prod((0, 1)), ValueError, r"prod: expected dim as an int"),
])
def test_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_repeat_interleave_one_argument_form_and_output_size():
    same(lambda m: (m.repeat_interleave(m.tensor([2, 0, 3])), m.repeat_interleave(m.tensor([4])),
                    m.tensor([[1.0, 2.0], [3.0, 4.0]]).repeat_interleave(m.tensor([1, 2]), dim=0, output_size=3),
                    m.tensor([1.0, 2.0]).repeat_interleave(2, output_size=4)))
    with pytest.raises(ValueError, match=r"repeat_interleave: expected output_size equal to the result's length \(4\)"):
        it.tensor([1.0, 2.0]).repeat_interleave(2, output_size=3)
    with pytest.raises(ValueError, match="repeat_interleave: expected a 1-D integer tensor of counts"):
        it.repeat_interleave(it.tensor([1.0, 2.0]))
