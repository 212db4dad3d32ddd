"""flip / fliplr / flipud / roll / rot90 / unbind / diff against torch 2.13: values, dtypes, gradients, second
derivatives, float64 finite differences, integer inputs and the errors."""
import numpy as np
import pytest

import infini_train as it
from tests.op_check import check_op
from tests.torch_parity import same

RNG = np.random.default_rng(5)
X = RNG.standard_normal((3, 4, 2)).astype(np.float32)
V = RNG.standard_normal((3, 4, 2)).astype(np.float32)

CASES = {
    "flip0": lambda m, x: x.flip(0), "flip02": lambda m, x: m.flip(x, (0, 2)), "flip_neg": lambda m, x: x.flip(-1, 0),
    "fliplr": lambda m, x: m.fliplr(x), "flipud": lambda m, x: x.flipud(),
    "roll_flat": lambda m, x: x.roll(5), "roll_dim": lambda m, x: m.roll(x, 1, 1),
    "roll_dims": lambda m, x: x.roll((-1, 3), (0, 1)), "roll_big": lambda m, x: x.roll(9, -2),
    "rot90": lambda m, x: m.rot90(x), "rot90_k2": lambda m, x: x.rot90(2, (1, 2)),
    "rot90_k3": lambda m, x: m.rot90(x, -1, (2, 0)), "rot90_k4": lambda m, x: x.rot90(4),
    "unbind": lambda m, x: m.stack([t * (i + 1) for i, t in enumerate(x.unbind(1))]),
    "diff": lambda m, x: m.diff(x), "diff_n2_dim0": lambda m, x: x.diff(2, 0),
    "diff_prepend": lambda m, x: m.diff(x, dim=1, prepend=x[:, :1] * 2, append=x[:, -1:] ** 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_torch(name):
    check_op([X.shape], lambda x: CASES[name](it, x), lambda x: CASES[name](__import__("torch"), x), fd_tol=1e-5)


@pytest.mark.parametrize("name", ["flip02", "roll_dims", "rot90", "unbind", "diff_prepend"])
def test_second_derivatives_match_torch(name):
    def run(m):
        x = m.tensor(X, requires_grad=True)
        out = CASES[name](m, x * x)
        (g,) = m.autograd.grad((out * out).sum(), x, create_graph=True)
        (gg,) = m.autograd.grad((g * m.tensor(V)).sum(), x)
        return g, gg

    same(run, rtol=2e-5, atol=1e-5)


def test_integer_and_bool_inputs():
    ints = np.arange(12).reshape(3, 4)
    same(lambda m: (m.tensor(ints).flip(1), m.tensor(ints).roll(-2), m.tensor(ints).rot90(), m.tensor(ints).diff(),
                    m.tensor(ints > 5).diff(dim=0), m.tensor(ints).unbind()))


def test_flip_and_roll_copy_rather_than_view():
    x = it.tensor([1.0, 2.0, 3.0])
    flipped, rolled = x.flip(0), x.roll(0)
    x[0] = 10.0
    assert flipped.tolist() == [3.0, 2.0, 1.0] and rolled.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("call,message", [
    (lambda x: x.flip(0, 0), "flip: expected distinct dims"),
    (lambda x: x.flip(3), "flip: expected dim in [-3, 2], got dim=3"),
    (lambda x: x.roll((1, 2), 0), "roll: expected as many shifts as dims"),
    (lambda x: x.roll((1, 2)), "roll: expected one shift when dims is None"),
    (lambda x: x.rot90(1, (0,)), "rot90: expected two dims"),
    (lambda x: it.tensor(1.0).rot90(), "rot90: expected a tensor of at least 2 dims"),
    (lambda x: it.tensor([1.0]).fliplr(), "fliplr: expected a tensor of at least 2 dims"),
    (lambda x: it.tensor(1.0).unbind(), "unbind: expected a tensor of at least 1 dim"),
    (lambda x: x.diff(-1), "diff: expected an order n >= 0"),
])
def test_errors_name_the_op_and_the_argument(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        call(it.tensor(X))
