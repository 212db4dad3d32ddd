import numpy as np
import pytest
import torch

import infini_train as it
from tests.autograd.test_low_precision import LOW, check_against_torch, dyadic
from tests.op_check import check_op

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),  # matmul
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),  # batched matmul
    ("i,j->ij", [(3,), (4,)]),  # outer
    ("i,i->", [(5,), (5,)]),  # dot
    ("ii", [(4, 4)]),  # trace, implicit
    ("ii->i", [(4, 4)]),  # diagonal
    ("iji->j", [(3, 2, 3)]),  # a diagonal across non-adjacent dims
    ("bii->bi", [(2, 3, 3)]),
    ("ij->ji", [(3, 4)]),  # transpose
    ("ba", [(3, 4)]),  # implicit output sorts the letters: a transpose
    ("ij->", [(3, 4)]),  # sum
    ("ijk->j", [(2, 3, 4)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),  # bilinear
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # a chain of three
    ("ijk,k->", [(2, 3, 4), (4,)]),  # i, j summed inside one operand
    ("ij,j->j", [(3, 4), (4,)]),  # i found in one operand only, summed away
    ("aij,ajj->ai", [(2, 3, 4), (2, 4, 4)]),  # a diagonal contracted with another operand
    ("...ij,...jk->...ik", [(5, 1, 2, 3), (4, 3, 2)]),  # ellipsis broadcasting
    ("...ij,...jk", [(5, 2, 3), (3, 4)]),  # implicit: ellipsis dims first
    ("...ij->ij", [(5, 2, 3)]),  # ellipsis dims summed away
    ("i...j->j...i", [(2, 3, 4, 5)]),  # ellipsis in the middle
    ("...i,...i->...", [(5, 3), (1, 3)]),
    ("...,...->...", [(2, 3), (3,)]),  # all dims covered
    ("i,i->i", [(3,), (1,)]),  # a size-1 dim broadcasts
    ("ij,jk", [(2, 1), (3, 4)]),  # a size-1 dim broadcasts and is summed
    (",i->i", [(), (3,)]),  # a 0-d operand
    ("ij,jk->ik", [(2, 0), (0, 4)]),  # empty contraction gives zeros
    ("Ab,bC->AC", [(2, 3), (3, 4)]),  # upper-case letters
    (" i j , j k -> i k ", [(2, 3), (3, 4)]),  # spaces are ignored
]


@pytest.mark.parametrize("equation,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_torch(equation, shapes):
    check_op(shapes, lambda *xs: it.einsum(equation, *xs), lambda *xs: torch.einsum(equation, *xs),
             rtol=1e-5, atol=1e-5)


def test_einsum_takes_operands_as_one_list():
    check_op([(2, 3), (3, 4)], lambda a, b: it.einsum("ij,jk", [a, b]), lambda a, b: torch.einsum("ij,jk", [a, b]),
             atol=1e-5)


def test_einsum_values_of_trace_diagonal_and_matmul():
    a = np.arange(9.0, dtype=np.float32).reshape(3, 3)
    assert it.einsum("ii", it.tensor(a)).item() == 12.0
    np.testing.assert_array_equal(it.einsum("ii->i", it.tensor(a)).numpy(), [0.0, 4.0, 8.0])
    np.testing.assert_array_equal(it.einsum("ij,jk->ik", it.tensor(a), it.tensor(a)).numpy(), a @ a)


def test_einsum_gradient_of_a_diagonal_is_zero_off_it():
    x = it.ones(3, 3, requires_grad=True)
    it.einsum("ii->i", x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.eye(3))


def test_einsum_transpose_does_not_alias_its_input():
    x = it.tensor([[1.0, 2.0], [3.0, 4.0]])
    y = it.einsum("ij->ji", x)
    y.zero_()
    np.testing.assert_array_equal(x.numpy(), [[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("equation,shapes,dtype", [
    ("ij->ji", [(2, 3)], torch.int32), ("i,i->i", [(3,), (3,)], torch.int32), ("ij,jk", [(2, 3), (3, 4)], torch.int32),
    ("ii", [(3, 3)], torch.int32), ("ij->i", [(2, 3)], torch.int16), ("ii->i", [(3, 3)], torch.bool),
    ("ij->i", [(2, 3)], torch.bool), ("i,i->i", [(3,), (3,)], torch.bool), ("i,j->ij", [(3,), (2,)], torch.int64),
], ids=str)
def test_einsum_integer_and_bool_dtypes_follow_torch(equation, shapes, dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 3, s).astype(str(dtype).split(".")[1]) for s in shapes]
    expect = torch.einsum(equation, *[torch.tensor(a) for a in arrays])
    got = it.einsum(equation, *[it.tensor(a) for a in arrays])
    assert str(got.dtype) == str(expect.dtype).split(".")[1]
    np.testing.assert_array_equal(got.numpy(), expect.numpy())


@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk", [(3, 4), (5, 2)], "einsum: expected size 4 \\(or 1\\) for subscript 'j'.*got size 5 in operand 1"),
    ("ii", [(3, 4)], "einsum: expected equal sizes for subscript 'i', repeated in operand 0, got sizes 3 and 4"),
    ("ijk", [(3, 4)], r"einsum: expected one subscript per dim of operand 0 \(shape \(3, 4\)\), got 3 subscripts"),
    ("ij...k", [(3, 4)], "got 3 subscripts and '...'"),
    ("ij", [(3, 4), (4,)], "einsum: expected as many operands as terms in the equation \\(1\\), got 2 operands"),
    ("ij,j", [(3, 4)], "expected as many operands as terms in the equation \\(2\\), got 1 operands"),
    ("i1", [(3, 4)], "einsum: expected subscripts in \\[a-zA-Z\\]"),
    ("..i", [(3, 4)], "einsum: expected '.' only as part of an ellipsis"),
    ("......", [(3, 4)], "einsum: expected at most one ellipsis for operand 0"),
    ("i->i->i", [(3,)], "einsum: expected at most one '->'"),
    ("ij->ii", [(3, 3)], "einsum: expected each output subscript once, got 'i' more than once"),
    ("ij->k", [(3, 3)], "einsum: expected output subscripts that appear in an input, got 'k' only in the output"),
    ("...i,...i", [(5, 3), (4, 3)], "einsum: expected the dims covered by '...' to broadcast across operands"),
], ids=str)
def test_einsum_errors(equation, shapes, message):
    with pytest.raises(ValueError, match=message):
        it.einsum(equation, *[it.ones(*s) for s in shapes])


def test_einsum_errors_on_operands():
    with pytest.raises(ValueError, match="einsum: expected operands of one dtype, got float32, float64"):
        it.einsum("i,i", it.ones(3), it.ones(3, dtype=it.float64))
    with pytest.raises(ValueError, match="einsum: expected at least one operand"):
        it.einsum("i")
    with pytest.raises(ValueError, match="einsum: expected Tensor operands, got ndarray at position 0"):
        it.einsum("i", np.ones(3))
    with pytest.raises(ValueError, match="einsum: expected integer or floating operands for a contraction"):
        it.einsum("i,i->", it.tensor([True]), it.tensor([False]))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("equation,shapes", [
    ("bij,bjk->bik", [(2, 6, 40), (2, 40, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 16), (2, 3, 7, 16)]),  # attention scores
    ("ij,j->i", [(6, 40), (40,)]),
    ("i,j->ij", [(6,), (5,)]),
    ("ii->i", [(5, 5)]),
    ("bij->j", [(3, 4, 5)]),
], ids=str)
def test_einsum_low_precision_equals_torch_bit_for_bit_on_exact_sums(equation, shapes, dtype):
    # dyadic inputs: every float32 sum is exact, so the one rounding to the low dtype gives torch's bits
    rng = np.random.default_rng(0)
    check_against_torch(lambda *ts: it.einsum(equation, *ts), lambda *ts: torch.einsum(equation, *ts),
                        [dyadic(rng, s, dtype) for s in shapes], dtype)
