import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

NAN = float("nan")


@pytest.mark.parametrize("shape,dim", [((7,), -1), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1), ((), 0), ((0, 3), 0)],
                         ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_torch(shape, dim, descending):
    check_op([shape], lambda x: it.sort(x, dim, descending), lambda x: torch.sort(x, dim, descending))


def test_sort_returns_named_values_and_int64_indices():
    out = it.sort(it.tensor([3.0, 1.0, 2.0]))
    assert type(out).__name__ == "sort"
    values, indices = out
    assert values.tolist() == [1.0, 2.0, 3.0] and out.values.tolist() == [1.0, 2.0, 3.0]
    assert indices.dtype == it.int64 and out.indices.tolist() == [1, 2, 0]
    assert not indices.requires_grad


@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_keeps_ties_in_input_order_and_nan_as_largest(descending):
    data = [3.0, NAN, 1.0, NAN, 3.0, -0.0, 0.0, float("inf"), -float("inf"), 1.0]
    expect = torch.sort(torch.tensor(data), descending=descending, stable=True)
    got = it.sort(it.tensor(data), descending=descending, stable=True)
    np.testing.assert_array_equal(got.indices.numpy(), expect.indices.numpy())
    np.testing.assert_array_equal(got.values.numpy(), expect.values.numpy())
    np.testing.assert_array_equal(it.argsort(it.tensor(data), descending=descending, stable=True).numpy(),
                                  expect.indices.numpy())
    if descending:
        assert got.indices.tolist()[:4] == [1, 3, 7, 0]  # nans first, in input order; then inf; then the first 3


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_of_integers_and_bools(dtype, descending):
    data = torch.tensor([2, 0, 1, 2, 0, 1, 1]).to(dtype)
    expect = torch.sort(data, descending=descending, stable=True)
    got = it.sort(it.tensor(data.numpy()), descending=descending, stable=True)
    np.testing.assert_array_equal(got.values.numpy(), expect.values.numpy())
    np.testing.assert_array_equal(got.indices.numpy(), expect.indices.numpy())


def test_sort_gradient_follows_the_permutation():
    x = it.tensor([[3.0, 1.0, 2.0]], requires_grad=True)
    values, _ = it.sort(x, descending=True)
    (values * it.tensor([[1.0, 10.0, 100.0]])).sum().backward()
    assert x.grad.tolist() == [[1.0, 100.0, 10.0]]


@pytest.mark.parametrize("shape,dim", [((7,), -1), ((3, 5), 0), ((2, 3, 4), 2), ((), 0)], ids=str)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_matches_torch(shape, dim, descending):
    check_op([shape], lambda x: it.argsort(x, dim, descending), lambda x: torch.argsort(x, dim=dim,
                                                                                         descending=descending))


@pytest.mark.parametrize("shape,k,dim", [((7,), 3, -1), ((4, 5), 2, 0), ((4, 5), 5, 1), ((2, 3, 4), 1, 1),
                                         ((4, 5), 0, 1), ((), 1, 0), ((), 0, -1), ((0, 3), 0, 0)], ids=str)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(shape, k, dim, largest):
    check_op([shape], lambda x: it.topk(x, k, dim, largest), lambda x: torch.topk(x, k, dim, largest))


def test_topk_nan_is_largest_and_unsorted_holds_the_same_elements():
    data = [3.0, NAN, 1.0, 5.0, -1.0]
    got = it.topk(it.tensor(data), 2)
    assert type(got).__name__ == "topk" and got.indices.tolist() == [1, 3]
    assert it.topk(it.tensor(data), 2, largest=False).indices.tolist() == [4, 2]
    x = torch.tensor([1.0, 5, 3, 7, 2, 9, 0])
    unsorted = it.topk(it.tensor(x.numpy()), 3, sorted=False)
    assert sorted(unsorted.indices.tolist()) == sorted(torch.topk(x, 3, sorted=False).indices.tolist())


def test_topk_gradient_reaches_only_the_picked_positions():
    x = it.tensor([4.0, 1.0, 3.0, 2.0], requires_grad=True)
    it.topk(x, 2).values.sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_topk_of_integers():
    values, indices = it.topk(it.tensor([1, 5, 3]), 2)
    assert values.dtype == it.int64 and values.tolist() == [5, 3] and indices.tolist() == [1, 2]


def test_changing_the_indices_in_place_is_caught_in_backward():
    x = it.tensor([3.0, 1.0, 2.0], requires_grad=True)
    values, indices = it.sort(x)
    indices.zero_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        values.sum().backward()


@pytest.mark.parametrize("call,message", [
    (lambda: it.topk(it.ones(3), 4), r"topk: expected k in \[0, 3\] \(the size of dim 0\), got k=4"),
    (lambda: it.topk(it.ones(3), -1), r"topk: expected k in \[0, 3\]"),
    (lambda: it.topk(it.ones(()), 2), r"topk: expected k in \[0, 1\]"),
    (lambda: it.topk(it.ones(3), 2.0), "topk: expected k in .* got k=2.0"),
    (lambda: it.topk(it.tensor([True, False]), 1), "topk: expected a numeric tensor, got a bool tensor"),
    (lambda: it.sort(it.ones(3), 1), r"sort: expected dim in \[-1, 0\] for a 1-D tensor, got dim=1"),
    (lambda: it.sort(it.ones(()), -2), r"sort: expected dim in \[-1, 0\] for a 0-D tensor"),
    (lambda: it.argsort(it.ones(2, 3), 2), r"argsort: expected dim in \[-2, 1\]"),
])
def test_sorting_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
