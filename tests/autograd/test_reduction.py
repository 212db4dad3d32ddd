import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op, make_inputs


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


def test_sum_mean_over_dim_of_0d():
    check_op([()], lambda x: x.sum(0), lambda x: x.sum(0))
    check_op([()], lambda x: x.mean(-1, True), lambda x: x.mean(-1, True))


# ------------------------------------------------------------------------------------------ max / min
def _call_extremum(mod, name, dim, keepdim):
    """x.max() for dim=None, x.amax(dims) for tuples, x.max(dim) -> (values, indices) for an int dim."""
    if dim is None:
        return lambda x: getattr(x, name)()
    if isinstance(dim, tuple):
        return lambda x: getattr(x, "a" + name)(dim, keepdim)
    return lambda x: getattr(mod, name)(x, dim, keepdim)


MAX_DIMS = [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True), ((0, 2), False), ((1,), False)]


@pytest.mark.parametrize("dim,keepdim", MAX_DIMS, ids=str)
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_without_ties(name, dim, keepdim):
    # random floats: no ties, so finite differences are well defined; an int dim compares indices too
    check_op([(2, 3, 4)], _call_extremum(it, name, dim, keepdim), _call_extremum(torch, name, dim, keepdim))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_dim_is_a_named_tuple_like_torch(name):
    x = make_inputs([(3, 5)])[0]
    ours, theirs = getattr(it.tensor(x), name)(dim=1), getattr(torch.tensor(x), name)(dim=1)
    values, indices = ours
    assert type(ours).__name__ == name and ours._fields == ("values", "indices")
    np.testing.assert_array_equal(values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), theirs.indices.numpy())
    assert ours.values is values and ours.indices is indices and indices.dtype == it.int64
    assert ours[0] is values and len(ours) == 2


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_a_tensor_is_elementwise(name):
    check_op([(2, 3), (2, 3)], lambda a, b: getattr(a, name)(b), lambda a, b: getattr(a, name)(b))
    check_op([(2, 3), (3,)], lambda a, b: getattr(it, name)(a, b), lambda a, b: getattr(torch, name)(a, b))


def test_max_with_tuple_dims_points_to_amax():
    with pytest.raises(ValueError, match="(?s)max: expected dim as an int.*HINT: .*amax"):
        it.ones(2, 3).max((0, 1))


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_amax_amin_all_dims(name):
    check_op([(2, 3)], lambda x: getattr(x, name)(), lambda x: getattr(x, name)())
    check_op([(2, 3)], lambda x: getattr(it, name)(x, 1, True), lambda x: getattr(torch, name)(x, 1, True))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_0d_and_empty_rows(name):
    check_op([()], lambda x: getattr(x, name)(), lambda x: getattr(x, name)())
    check_op([()], lambda x: getattr(x, name)(0), lambda x: getattr(torch, name)(x, 0))
    check_op([(0, 3)], lambda x: getattr(x, name)(1), lambda x: getattr(torch, name)(x, 1))


TIES = np.array([[1.0, 3.0, 3.0, -1.0],
                 [2.0, 2.0, 0.0, 0.0],
                 [3.0, -1.0, 3.0, -1.0]], np.float32)


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 1), False),
                                         ((0,), True)], ids=str)
@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_gradient_with_ties_matches_torch(name, dim, keepdim):
    # ties: a full/tuple reduction splits the gradient evenly among tied elements (x.max(), amax), an int
    # dim sends it to the first one (torch.max(x, dim)). FD is undefined at ties: compare with torch only.
    check_op([TIES], _call_extremum(it, name, dim, keepdim), _call_extremum(torch, name, dim, keepdim), fd=False)


def test_max_ties_explicit_values():
    x = it.tensor(TIES, requires_grad=True)
    x.max().backward()
    expect = np.zeros_like(TIES)
    expect[TIES == 3.0] = 0.25
    np.testing.assert_array_equal(x.grad.numpy(), expect)
    x.grad = None
    x.max(1).values.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_extremum_of_empty_dim_is_an_error(name):
    with pytest.raises(ValueError, match=f"(?s){name.capitalize()}: expected a non-empty reduction dim 0.*HINT"):
        getattr(it.zeros(0, 3), name)(0)
    with pytest.raises(ValueError, match="non-empty reduction dim"):
        getattr(it.zeros(0, 3), name)()


def test_max_min_of_integer_tensor():
    x = it.tensor([[3, 1, 4], [1, 5, 9]])
    np.testing.assert_array_equal(x.max(1).values.numpy(), [4, 9])
    np.testing.assert_array_equal(x.max(1).indices.numpy(), [2, 2])
    np.testing.assert_array_equal(x.min().numpy(), 1)
    assert x.max().dtype == it.int64 and not x.max().requires_grad


# ------------------------------------------------------------------------------------ argmax / argmin
@pytest.mark.parametrize("dim,keepdim", [(None, False), (None, True), (0, False), (1, True), (-1, False)], ids=str)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_match_torch_including_ties(name, dim, keepdim):
    for x in [TIES, make_inputs([(3, 4)])[0]]:
        check_op([x], lambda t: getattr(t, name)(dim, keepdim), lambda t: getattr(t, name)(dim, keepdim), grad=False)
        check_op([x], lambda t: getattr(it, name)(t, dim, keepdim), lambda t: getattr(torch, name)(t, dim, keepdim),
                 grad=False)


def test_argmax_of_0d_and_rows_of_empty():
    check_op([np.array(2.0, np.float32)], lambda t: t.argmax(), lambda t: t.argmax(), grad=False)
    check_op([np.array(2.0, np.float32)], lambda t: t.argmin(0), lambda t: t.argmin(0), grad=False)
    check_op([np.zeros((0, 3), np.float32)], lambda t: t.argmax(1), lambda t: t.argmax(1), grad=False)


def test_argmax_is_int64_without_gradient():
    x = it.randn(3, 4, requires_grad=True)
    out = x.argmax(1)
    assert out.dtype == it.int64 and not out.requires_grad and out.grad_fn is None


def test_argmax_rejects_tuple_dims():
    with pytest.raises(ValueError, match="Argmax: expected dim as None or an int"):
        it.ones(2, 3).argmax((0, 1))


# ------------------------------------------------------------------------------------------ var / std
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 2), True)], ids=str)
@pytest.mark.parametrize("correction", [1, 0, 2])
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std(name, dim, keepdim, correction):
    # every reduced extent > correction: degrees of freedom stay positive (see the nan test below)
    check_op([(3, 4, 2)], lambda x: getattr(x, name)(dim, keepdim=keepdim, correction=correction),
             lambda x: getattr(x, name)(dim, keepdim=keepdim, correction=correction))
    check_op([(3, 4, 2)], lambda x: getattr(it, name)(x, dim=dim, keepdim=keepdim, correction=correction),
             lambda x: getattr(torch, name)(x, dim=dim, keepdim=keepdim, correction=correction))


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_default_is_unbiased(name):
    check_op([(5,)], lambda x: getattr(x, name)(), lambda x: getattr(x, name)())
    check_op([(4, 3)], lambda x: getattr(x, name)(0), lambda x: getattr(x, name)(0))


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns that dof <= 0
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_with_no_degrees_of_freedom_is_nan_like_torch(name):
    check_op([(1, 3)], lambda x: getattr(x, name)(0), lambda x: getattr(x, name)(0), fd=False)
    check_op([()], lambda x: getattr(x, name)(), lambda x: getattr(x, name)(), fd=False)
    check_op([(0, 3)], lambda x: getattr(x, name)(0), lambda x: getattr(x, name)(0), fd=False)
    assert np.isnan(getattr(it.ones(1), name)().item())


def test_std_of_constant_has_zero_gradient_like_torch():
    check_op([np.full((2, 3), 1.5, np.float32)], lambda x: x.std(1), lambda x: x.std(1), fd=False)
    x = it.full((4,), 2.0, requires_grad=True)
    x.std().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(4))


def test_var_of_integer_tensor_is_an_error():
    with pytest.raises(ValueError, match="(?s)Var: expected a floating-point tensor.*int64.*HINT"):
        it.arange(4).var()
