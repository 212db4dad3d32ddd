import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.embedding import one_hot, scatter_add_rows
from tests.autograd.test_low_precision import LOW, check_against_torch, dyadic, outputs_and_grads
from tests.op_check import check_op

F = torch.nn.functional


@pytest.mark.parametrize("ids", [np.array([[0, 3, 3], [1, 0, 3]]), np.array([4, 4, 4, 4, 4]), np.array(2),
                                 np.zeros((2, 0), np.int64), np.array([2, 0, 1], np.int32)], ids=repr)
def test_embedding_matches_torch_with_repeated_ids(ids):
    check_op([ids, (5, 4)], it.embedding, F.embedding)


@pytest.mark.parametrize("padding_idx", [2, -2, 0])
def test_embedding_padding_idx_gets_no_gradient(padding_idx):
    ids = np.array([[1, 2, 2, 0], [3, 2, 1, 1]], np.int64)
    # fd=False: by definition the padding row's gradient is zero, not the true derivative
    check_op([ids, (4, 3)], lambda i, w: it.embedding(i, w, padding_idx=padding_idx),
             lambda i, w: F.embedding(i, w, padding_idx=padding_idx), fd=False)
    w = it.ones(4, 3, requires_grad=True)
    it.embedding(it.tensor(ids), w, padding_idx=padding_idx).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy()[padding_idx], 0.0)
    assert w.grad.numpy()[1].sum() == 9.0  # id 1 appears three times, 3 columns


def test_embedding_gradient_with_heavily_repeated_ids_matches_torch():
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.5, (4, 64)) - 1, 49)  # runs of equal ids of many lengths, up to ~100
    check_op([ids, (50, 8)], it.embedding, F.embedding, fd=False)


@pytest.mark.parametrize("pattern", ["unique", "all_same", "runs", "random", "empty"])
def test_scatter_add_rows_equals_add_at(pattern):
    rng = np.random.default_rng(1)
    ids = {"unique": rng.permutation(20)[:13], "all_same": np.full(37, 5), "empty": np.zeros(0, np.int64),
           "runs": np.repeat(np.arange(8), [1, 2, 3, 4, 5, 7, 8, 33]), "random": rng.integers(0, 6, 101)}[pattern]
    rng.shuffle(ids)
    rows = rng.standard_normal((len(ids), 3)).astype(np.float64)
    table = rng.standard_normal((20, 3))
    expect = table.copy()
    np.add.at(expect, ids, rows)
    np.testing.assert_allclose(scatter_add_rows(np, table, ids, rows), expect, rtol=1e-12, atol=1e-12)


def test_embedding_unsigned_ids_and_no_grad_for_ids():
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    ids = np.array([[5, 0], [2, 2]], np.uint16)
    out = it.embedding(it.tensor(ids), it.tensor(w))
    np.testing.assert_array_equal(out.numpy(), w[ids])
    assert out.grad_fn is None  # weight does not require grad


def test_embedding_errors():
    with pytest.raises(ValueError, match=r"embedding: expected ids in \[0, 4\) \(num_embeddings=4\), got id 4\n"
                                         r"HINT: the tokenizer's vocabulary must fit"):
        it.embedding(it.tensor([1, 4]), it.ones(4, 2))
    with pytest.raises(ValueError, match=r"embedding: expected ids in \[0, 4\) \(num_embeddings=4\), got id -1"):
        it.embedding(it.tensor([[-1, 0]]), it.ones(4, 2))
    with pytest.raises(ValueError, match="embedding: expected integer ids, got ids of dtype float32"):
        it.embedding(it.tensor([1.0]), it.ones(4, 2))
    with pytest.raises(ValueError, match=r"embedding: expected a 2-D weight \(num_embeddings, embedding_dim\)"):
        it.embedding(it.tensor([1]), it.ones(4))
    with pytest.raises(ValueError, match=r"embedding: expected padding_idx in \[-4, 4\) or None, got 4"):
        it.embedding(it.tensor([1]), it.ones(4, 2), padding_idx=4)


# ------------------------------------------------------------------------------------------- one_hot
@pytest.mark.parametrize("ids,num_classes", [
    (np.array([3, 1, 2]), -1), (np.array([[0, 2], [1, 0]]), 5), (np.array(2), -1), (np.zeros((0, 2), np.int64), 4),
    (np.array([0, 0]), 1),
], ids=repr)
def test_one_hot_matches_torch(ids, num_classes):
    got = one_hot(it.tensor(ids), num_classes)
    expect = F.one_hot(torch.tensor(ids), num_classes)
    assert got.dtype == it.int64 and got.shape == tuple(expect.shape)
    np.testing.assert_array_equal(got.numpy(), expect.numpy())


def test_one_hot_values_and_no_gradient():
    got = one_hot(it.tensor([2, 0]), 3)
    assert got.tolist() == [[0, 0, 1], [1, 0, 0]]
    assert got.grad_fn is None and not got.requires_grad


def test_one_hot_is_not_a_top_level_function():
    assert not hasattr(it, "one_hot")


@pytest.mark.parametrize("ids,num_classes,message", [
    ([1, 2], -1, None), ([-1, 2], -1, "one_hot: expected non-negative class values, got class -1"),
    ([3, 1], 3, "one_hot: expected class values smaller than num_classes=3, got class 3"),
    ([3, 1], -2, "one_hot: expected class values smaller than num_classes=-2"),
    ([1], 0, "one_hot: expected class values smaller than num_classes=0"),
    (np.zeros(0, np.int64), -1, "one_hot: expected num_classes > 0 for an empty tensor, got num_classes=-1"),
    (np.zeros(0, np.int64), 0, "one_hot: expected num_classes > 0 for an empty tensor"),
    (np.array([1], np.int32), -1, "one_hot: expected an int64 index tensor, got dtype int32"),
    ([1.0], -1, "one_hot: expected an int64 index tensor, got dtype float32"),
    ([True], -1, "one_hot: expected an int64 index tensor, got dtype bool"),
], ids=str)
def test_one_hot_errors_where_torch_errs(ids, num_classes, message):
    if message is None:  # the control case: valid for both
        one_hot(it.tensor(ids), num_classes)
        F.one_hot(torch.tensor(ids), num_classes)
        return
    with pytest.raises(ValueError, match=message):
        one_hot(it.tensor(ids), num_classes)
    with pytest.raises(RuntimeError):
        F.one_hot(torch.tensor(np.asarray(ids)), num_classes)


@pytest.mark.parametrize("dtype", LOW)
def test_embedding_low_precision_distinct_ids_equal_torch(dtype):
    rng = np.random.default_rng(0)
    ids = rng.permutation(50)[:24].reshape(4, 6)  # no id twice: each gradient row is the upstream row as is
    check_against_torch(it.embedding, F.embedding, [ids, dyadic(rng, (50, 8), dtype)], dtype)


@pytest.mark.parametrize("dtype", LOW)
def test_embedding_low_precision_sums_repeated_ids_in_float32_and_rounds_once(dtype):
    # |values| in [0.5, 2) carry 8 (11) significant bits: sums of ~12 of them are exact in float32 but not in the
    # low dtype, so the expected gradient is the float32 sum rounded once. Accumulating in the low dtype (as
    # torch's CPU kernel and our earlier one did) rounds after every add and drifts from it
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 4, size=(6, 8))  # 48 rows onto 4 ids
    magnitudes = rng.uniform(0.5, 2.0, (6, 8, 8)) * rng.choice([-1.0, 1.0], (6, 8, 8))
    weight, cotangent = dyadic(rng, (10, 8), dtype), magnitudes.astype(np.float32).astype(dtype)
    (out, grad), out_dtype = outputs_and_grads(it, it.embedding, [ids, weight], cotangent)
    assert out_dtype == dtype and grad.dtype == weight.dtype
    np.testing.assert_array_equal(out, weight[ids])
    expect = np.zeros((10, 8), np.float64)
    np.add.at(expect, ids.reshape(-1), cotangent.reshape(-1, 8).astype(np.float64))
    np.testing.assert_array_equal(grad.view(np.uint16), expect.astype(np.float32).astype(dtype).view(np.uint16))
