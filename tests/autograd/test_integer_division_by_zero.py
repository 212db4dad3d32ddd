"""Integer floor division, remainder and div(rounding_mode=...) by zero raise, as torch does (NumPy would return 0
with a warning); float division keeps IEEE results (inf / nan), and non-zero integer divisors match torch."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.elementwise import IntegerDivisionByZero

A = [5, -7, 3, 0]
CASES = {
    "floordiv": (lambda a, b: a // b, lambda a, b: a // b),
    "rfloordiv": (lambda a, b: 9 // b, lambda a, b: 9 // b),
    "mod": (lambda a, b: a % b, lambda a, b: a % b),
    "rmod": (lambda a, b: 9 % b, lambda a, b: 9 % b),
    "remainder": (lambda a, b: it.remainder(a, b), lambda a, b: torch.remainder(a, b)),
    "floor_divide": (lambda a, b: it.floor_divide(a, b), lambda a, b: torch.floor_divide(a, b)),
    "div_floor": (lambda a, b: it.div(a, b, rounding_mode="floor"),
                  lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "div_trunc": (lambda a, b: it.div(a, b, rounding_mode="trunc"),
                  lambda a, b: torch.div(a, b, rounding_mode="trunc")),
}


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
@pytest.mark.parametrize("case", list(CASES))
def test_integer_division_by_a_zero_tensor_element_raises_like_torch(case, dtype):
    ours, theirs = CASES[case]
    a = [abs(v) for v in A] if dtype == "uint8" else A
    b = [2, 0, 1, 3]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        theirs(torch.tensor(a, dtype=getattr(torch, dtype)), torch.tensor(b, dtype=getattr(torch, dtype)))
    with pytest.raises(ZeroDivisionError, match="integer division by zero"):
        ours(it.tensor(np.array(a, dtype)), it.tensor(np.array(b, dtype)))


@pytest.mark.parametrize("case", ["floordiv", "mod", "remainder", "floor_divide", "div_floor", "div_trunc"])
def test_integer_division_by_a_zero_scalar_raises(case):
    ours, theirs = CASES[case]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        theirs(torch.tensor(A), 0)
    with pytest.raises(IntegerDivisionByZero) as info:
        ours(it.tensor(A), 0)
    assert isinstance(info.value, RuntimeError)  # code written for torch's RuntimeError catches it too
    assert "HINT:" in str(info.value)


def test_in_place_integer_division_by_zero_raises_and_leaves_the_tensor_unchanged():
    t = it.tensor(A)
    for op in ("__ifloordiv__", "__imod__"):
        with pytest.raises(ZeroDivisionError):
            getattr(t, op)(it.tensor([1, 0, 1, 1]))
    assert t.tolist() == A


@pytest.mark.parametrize("case", list(CASES))
def test_non_zero_integer_divisors_and_float_zero_divisors_match_torch(case):
    ours, theirs = CASES[case]
    b = [2, -3, 4, 7]
    np.testing.assert_array_equal(ours(it.tensor(A), it.tensor(b)).numpy(),
                                  theirs(torch.tensor(A), torch.tensor(b)).numpy())
    fa, fb = [5.0, -7.0, 0.0, 1.5], [2.0, 0.0, 0.0, -0.0]
    with np.errstate(all="ignore"):
        got = ours(it.tensor(fa), it.tensor(fb)).numpy()
    np.testing.assert_array_equal(got, theirs(torch.tensor(fa), torch.tensor(fb)).numpy())
