"""Comparisons, logical and bitwise ops, float classification: torch's results and dtypes, and clear errors."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import same

A = [[7, -3, 12], [5, 0, -8]]
B = [[3, 6, -1], [1, 2, 9]]


@pytest.mark.parametrize("op", ["__and__", "__or__", "__xor__", "__lshift__", "__rshift__"])
@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "int64"])
def test_bitwise_binary_on_integers_is_bitwise(op, dtype):
    lhs = [[7, 3, 12], [5, 0, 8]] if dtype == "uint8" or op in ("__lshift__", "__rshift__") else A
    same(lambda m: getattr(m.tensor(lhs, dtype=getattr(m, dtype)), op)(m.tensor([[1, 2, 3], [0, 1, 2]],
                                                                                  dtype=getattr(m, dtype))))
    same(lambda m: getattr(m.tensor(lhs, dtype=getattr(m, dtype)), op)(2))


def test_bitwise_not_and_mixed_integer_dtypes():
    same(lambda m: ~m.tensor(A))
    same(lambda m: ~m.tensor([1, 200], dtype=m.uint8))
    same(lambda m: m.tensor(A, dtype=m.int32) & m.tensor(B, dtype=m.int64))
    same(lambda m: 6 | m.tensor(A))
    same(lambda m: m.bitwise_xor(m.tensor(A), m.tensor(B)))


def test_bitwise_on_bool_is_logical():
    p, q = [[True, False, True]], [[True, True, False]]
    same(lambda m: (m.tensor(p) & m.tensor(q), m.tensor(p) | m.tensor(q), m.tensor(p) ^ m.tensor(q), ~m.tensor(p)))
    same(lambda m: (m.tensor(A) > 0) & (m.tensor(B) > 0))


def test_bitwise_on_floats_is_an_error():
    for expr in (lambda: it.ones(2) & it.ones(2), lambda: ~it.ones(2), lambda: it.ones(2) | 1,
                 lambda: it.tensor([True]) << it.tensor([True])):
        with pytest.raises(ValueError, match="(?s)bitwise.*: expected integer.*tensors, got dtype.*HINT"):
            expr()
    with pytest.raises(NotImplementedError):
        torch.ones(2) & torch.ones(2)


def test_comparisons_and_logical_ops():
    same(lambda m: (m.tensor(A) == m.tensor(B), m.tensor(A) != 0, m.tensor(A) <= 5, m.tensor(A) >= m.tensor(B)))
    same(lambda m: (m.logical_and(m.tensor(A), m.tensor(B)), m.logical_or(m.tensor(A), m.tensor(B) > 0),
                    m.logical_xor(m.tensor(A), m.tensor(B)), m.logical_not(m.tensor(A))))


def test_float_classification():
    values = [1.0, float("inf"), -float("inf"), float("nan"), 0.0]
    same(lambda m: (m.tensor(values).isfinite(), m.tensor(values).isnan(), m.tensor(values).isinf()))
    same(lambda m: (m.isfinite(m.tensor(A)), m.isnan(m.tensor(A)), m.isinf(m.tensor(A))))
    same(lambda m: m.isnan(m.tensor(values, dtype=m.bfloat16)))
    x = it.tensor(values, requires_grad=True)
    assert not x.isnan().requires_grad and x.isnan().dtype == it.bool
    np.testing.assert_array_equal(x.isfinite().numpy(), [True, False, False, False, True])
