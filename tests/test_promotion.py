"""Type promotion as torch: the pairwise table, the three tiers (tensors with dims, 0-d tensors, Python/NumPy
scalars), ops that promote (arithmetic, comparisons, where, clamp, cat/stack), and gradients returned in each
input's own dtype."""
import itertools

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.promotion import promote_types, result_type
from tests.torch_parity import same

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def test_pairwise_table_equals_torch():
    for a, b in itertools.product(DTYPES, DTYPES):
        ours = promote_types(it.backend.as_dtype(a), it.backend.as_dtype(b))
        theirs = torch.promote_types(getattr(torch, a), getattr(torch, b))
        assert str(ours) == str(theirs).replace("torch.", ""), (a, b)


def _operand(m, kind, dtype):
    """A (2,)-tensor, a 0-d tensor, a Python scalar or a NumPy scalar of the given dtype."""
    value = {"bool": True}.get(dtype, 3)
    if kind == "tensor":
        return m.tensor([value, value], dtype=getattr(m, dtype))
    if kind == "0d":
        return m.tensor(value, dtype=getattr(m, dtype))
    if kind == "py":
        return {"bool": True, "int64": 3, "float32": 2.5}[dtype]
    return {"bool": np.bool_(True), "int64": np.int64(3), "float32": np.float64(2.5)}[dtype]


CASES = [(k1, d1, k2, d2) for k1 in ("tensor", "0d") for d1 in ("bool", "uint8", "int32", "int64", "float16",
                                                                  "bfloat16", "float32", "float64")
         for k2, d2 in [("0d", "float64"), ("0d", "int64"), ("0d", "bool"), ("py", "float32"), ("py", "int64"),
                        ("py", "bool"), ("np", "float32"), ("np", "int64"), ("tensor", "int16"),
                        ("tensor", "float16")]]


@pytest.mark.parametrize("k1,d1,k2,d2", CASES, ids=str)
def test_result_dtype_of_binary_ops_equals_torch(k1, d1, k2, d2):
    ours = [_operand(it, k1, d1), _operand(it, k2, d2)]
    theirs = [_operand(torch, k1, d1), _operand(torch, k2, d2)]
    expect = torch.result_type(*theirs)
    raw = [x.array if isinstance(x, it.Tensor) else x for x in ours]
    assert str(result_type(*raw)) == str(expect).replace("torch.", "")
    for op in ("__add__", "__mul__", "__sub__"):
        if "bool" in (d1, d2) and op == "__sub__":
            continue  # torch refuses subtracting bools
        assert str(getattr(ours[0], op)(ours[1]).dtype) == str(getattr(theirs[0], op)(theirs[1]).dtype).replace(
            "torch.", ""), op


def test_the_issue_examples():
    same(lambda m: np.float64(2.0) * m.ones(2))  # a NumPy float64 scalar is a wrapped number: float32
    same(lambda m: m.tensor(2.0, dtype=m.float64) * m.ones(2))  # a 0-d float64 tensor does not win: float32
    same(lambda m: m.ones(2, dtype=m.int32) + m.tensor(2))  # int32 + 0-d int64: int32
    same(lambda m: m.ones(2, dtype=m.int32) * 2.5)  # a Python float with ints: the default float dtype
    same(lambda m: m.ones(2, dtype=m.int32) / m.ones(2, dtype=m.int32))  # true division of ints: float32
    same(lambda m: m.ones(2, dtype=m.int32) + m.tensor(2.0, dtype=m.float64))  # a higher category wins: float64


def test_values_are_computed_in_the_result_dtype():
    # float32 + a 0-d float64 tensor: both rounded to float32 first, then added, exactly as torch
    same(lambda m: m.tensor([1.0, 1e-8, 3.3]) + m.tensor(0.1, dtype=m.float64), rtol=0, atol=0)
    same(lambda m: m.tensor([16777216.0]) + np.float64(1.0), rtol=0, atol=0)


def test_ops_that_promote():
    same(lambda m: m.where(m.tensor([True, False]), m.tensor([1, 2], dtype=m.int32), m.tensor([0.5, 1.5])))
    same(lambda m: m.where(m.tensor([True, False]), 1.0, 0))
    same(lambda m: m.maximum(m.tensor([1, 5]), m.tensor([2.5, 0.5], dtype=m.float16)))
    same(lambda m: m.tensor([1, 5]).clamp(min=1.5))
    same(lambda m: m.tensor([1, 2, 3]) < 2.5)
    same(lambda m: m.tensor([1.0, 2.0], dtype=m.float16) == m.tensor([1, 2]))


@pytest.mark.parametrize("join", ["cat", "stack"])
def test_cat_and_stack_promote(join):
    for dtypes in [("int32", "float64"), ("float16", "bfloat16"), ("int64", "float16"), ("bool", "uint8", "int8")]:
        same(lambda m, dtypes=dtypes: getattr(m, join)([m.ones(2, dtype=getattr(m, d)) * 3 for d in dtypes]))


def test_gradients_come_back_in_each_inputs_dtype():
    def run(m):
        a = m.tensor([1.0, 2.0], requires_grad=True)
        b = m.tensor(3.0, dtype=m.float64, requires_grad=True)
        c = m.tensor([0.5, 0.25], dtype=m.float16, requires_grad=True)
        d = m.tensor([1.5], dtype=m.float64, requires_grad=True)
        out = m.cat([a * b, c.float() * 2, d.float()]) * m.tensor(2.0, dtype=m.float64)
        inner = b * 2  # a float64 non-leaf, fed back into float32 math: its gradient arrives as float64
        (out.sum() + (a * inner).sum()).backward()
        return out, a.grad, b.grad, c.grad, d.grad

    same(run)
