"""In-place ops as in torch: augmented assignment, history rebased on non-leaf tensors, setitem that records
gradients, the leaf rules, dtype and shape rules. Every case runs the same code with torch."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import grads, same

RNG = np.random.default_rng(0)
X = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((3, 4)).astype(np.float32)
ROW = RNG.standard_normal(4).astype(np.float32)


# ------------------------------------------------------------------------------------- augmented assignment
def _augmented(m, op, x, other):
    """Run ``x <op> other`` and check that x is still the same object (changed in place)."""
    scope = {"x": x, "other": other}
    exec(f"x {op} other", scope)
    assert scope["x"] is x
    return x


@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/=", "//=", "%=", "**="])
def test_float_augmented_assignment_is_in_place(op):
    same(lambda m: _augmented(m, op, m.tensor(X), m.tensor(W) * 0.5 + 2), rtol=1e-5)


@pytest.mark.parametrize("op", ["+=", "-=", "*=", "//=", "%=", "**=", "&=", "|=", "^=", "<<=", ">>="])
def test_integer_augmented_assignment_matches_torch(op):
    same(lambda m: _augmented(m, op, m.tensor([[7, -3, 12], [5, 0, -8]]), 3))
    same(lambda m: _augmented(m, op, m.tensor([[7, -3, 12], [5, 0, -8]]), m.tensor([1, 2, 3])))


def test_matmul_assignment_rebinds_like_torch():
    def run(m):
        a = m.tensor(X[:, :3])
        b = m.tensor(W[:3, :3])
        old = a
        a @= b
        return a, old, a is old

    ours = same(run)
    assert ours[2] is False  # neither framework has an in-place matmul: `a @= b` makes a new tensor


def test_handwritten_sgd_loop_trains_like_torch():
    def train(m):
        w = m.tensor(W[:, :2].copy(), requires_grad=True)
        x, y = m.tensor(X), m.tensor(X[:, :2] * 0.5)
        losses = []
        for _ in range(5):
            loss = ((x[:, :3] @ w - y) ** 2).mean()
            loss.backward()
            with m.no_grad():
                w -= 0.1 * w.grad
                w.grad.zero_()
            losses.append(loss.item())
        return w, losses

    ours = same(train, rtol=1e-5)
    assert ours[1][-1] < ours[1][0]


def test_slice_augmented_assignment_writes_through_to_the_base():
    def run(m):
        x = m.tensor(X)
        v = x[0:1]
        v += 1
        x[1:, 2] *= -2
        return x

    same(run)


# ---------------------------------------------------------------------------------- non-leaf history
def _leaves(m):
    return m.tensor(X, requires_grad=True), m.tensor(W, requires_grad=True)


@pytest.mark.parametrize("case", ["add", "mul_by_other", "exp", "chain", "div", "clamp", "sigmoid",
                                  "masked_fill", "pow", "sub_alpha", "neg_abs", "copy"])
def test_inplace_on_non_leaf_gives_torch_gradients(case):
    def run(m):
        x, w = _leaves(m)
        y = x * 2
        if case == "add":
            y.add_(1)
        elif case == "mul_by_other":
            y.mul_(w)  # needs y's old value in backward: kept like torch's original_self
        elif case == "exp":
            y.exp_()  # saves its output: y's new memory
        elif case == "chain":
            y.add_(w).mul_(w).tanh_()
        elif case == "div":
            y.div_(w * w + 1)
        elif case == "clamp":
            y.clamp_(-1, 1)
        elif case == "sigmoid":
            y.sigmoid_()
        elif case == "masked_fill":
            y.masked_fill_(w > 0, 0.5)
        elif case == "pow":
            y.pow_(2)
        elif case == "sub_alpha":
            y.sub_(w, alpha=3)
        elif case == "neg_abs":
            y.neg_().abs_()
        elif case == "copy":
            y.copy_(w * 3)
        (y * m.tensor(W)).sum().backward()
        return y, grads(x, w)

    same(run, rtol=1e-5)


def test_inplace_with_itself_as_operand_keeps_both_old_values():
    # torch refuses y.mul_(y) at backward (its saved `other` was overwritten); here the node keeps copies of what
    # the write overwrites, so the gradient is the one of the out-of-place y * y
    x = it.tensor(X, requires_grad=True)
    y = x * 2
    y.mul_(y)
    y.sum().backward()
    xt = torch.tensor(X, requires_grad=True)
    ((xt * 2) * (xt * 2)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)


def test_inplace_rebases_grad_fn_and_keeps_the_object():
    x = it.tensor(X, requires_grad=True)
    y = x * 2
    first = y.grad_fn
    out = y.add_(1)
    assert out is y and y.grad_fn is not first and y.grad_fn.next_functions[0][0] is first


def test_inplace_with_grad_value_on_tensor_without_history():
    def run(m):
        w = m.tensor(W, requires_grad=True)
        buf = m.zeros(3, 4)
        buf.add_(w * 2)
        buf.mul_(w)
        buf.sum().backward()
        return buf.requires_grad, buf, w.grad

    same(run)


def test_saved_tensor_changed_after_use_still_raises():
    for m in (it, torch):
        x = m.tensor(X, requires_grad=True)
        y = x * 2
        z = y * y
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_exp_output_changed_again_raises_like_torch():
    for m in (it, torch):
        x = m.tensor(X, requires_grad=True)
        y = (x * 1).exp_()
        z = y * 1  # Mul keeps no copy of y: the next change invalidates Exp's saved output
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (z + y).sum().backward()


# ----------------------------------------------------------------------------------------- setitem
@pytest.mark.parametrize("case", ["basic", "row", "advanced", "repeated", "mask", "broadcast", "scalar_then_tensor",
                                  "non_leaf_base", "two_writes"])
def test_setitem_records_gradients_like_torch(case):
    def run(m):
        x, w = _leaves(m)
        buf = m.zeros(5, 4)
        if case == "basic":
            buf[1:4] = x * 2
        elif case == "row":
            buf[2] = x[0] * w[1]
        elif case == "advanced":
            buf[m.tensor([0, 3, 4])] = x.exp()
        elif case == "repeated":
            buf[m.tensor([1, 1, 2])] = x  # torch's gradient: every selected position, repeats included
        elif case == "mask":
            buf[m.tensor([True, False, True, False, True])] = w - x
        elif case == "broadcast":
            buf[:, 1] = x[0, 0] * 3
        elif case == "scalar_then_tensor":
            buf[0] = 7.0
            buf[1:3, 1:3] = w[:2, :2]
        elif case == "non_leaf_base":
            buf = x * 1
            buf[0] = w[0] * 2
            buf[1:, 0] = 0.0
        elif case == "two_writes":
            buf[0:2] = x[:2]
            buf[1:3] = w[:2] * buf[0:2].clone()  # without clone both refuse: the write changes a saved view
        (buf * m.arange(buf.numel()).reshape(buf.shape)).sum().backward()
        return buf.requires_grad, buf, grads(x, w)

    same(run, rtol=1e-5)


def test_setitem_without_grad_is_plain_assignment():
    def run(m):
        buf = m.zeros(3, 4, dtype=m.int64)
        buf[0] = 1.7  # cast like torch's copy (truncated)
        buf[1, m.tensor([0, 2])] = m.tensor([5, 6])
        buf[2][1:] = 9
        return buf, buf.requires_grad

    same(run)


def test_uint8_index_is_a_mask():
    same(lambda m: m.arange(5)[m.tensor([1, 0, 1, 0, 1], dtype=m.uint8)])
    x = it.arange(5)
    x[it.tensor([0, 1, 0, 0, 1], dtype=it.uint8)] = -1  # torch 2.13 refuses a uint8 mask here; it is one here too
    np.testing.assert_array_equal(x.numpy(), [0, -1, 2, 3, -1])


# -------------------------------------------------------------------------------------- leaf rules
def test_leaf_and_view_of_leaf_refuse_in_place_under_grad_like_torch():
    for m in (it, torch):
        leaf = m.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf .* that requires grad is being used in an in-place"):
            leaf.add_(1)
        with pytest.raises(RuntimeError, match="a view of a leaf .* that requires grad"):
            leaf[0].mul_(2)
        with pytest.raises(RuntimeError, match="leaf"):
            leaf[0] = 1.0
        with m.no_grad():
            leaf[0] = 1.0
            leaf.add_(1)
        np.testing.assert_array_equal(leaf.detach().numpy()[0], 2.0)


# ------------------------------------------------------------------------------------- dtype and shape
def test_in_place_result_must_be_castable_like_torch():
    for m in (it, torch):
        with pytest.raises(RuntimeError, match="result type .* can't be cast to the desired output type"):
            m.arange(3).add_(0.5)
        with pytest.raises(RuntimeError, match="can't be cast"):
            m.arange(3).div_(2)
        with pytest.raises(RuntimeError, match="can't be cast"):
            m.arange(3).exp_()
    same(lambda m: m.ones(3).add_(m.tensor([1.0, 2.0, 3.0], dtype=m.float64) / 3))
    same(lambda m: m.tensor([5, 7]).div_(2, rounding_mode="floor"))


def test_in_place_cannot_grow_the_shape():
    with pytest.raises(ValueError, match=r"(?s)add_: expected operands that broadcast to the tensor's shape \(2,\), "
                                         r"got operand shapes \(2, 2\).*HINT"):
        it.ones(2).add_(it.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"(?s)mul_: output with shape \(2,\) doesn't match the broadcast shape"):
        (it.ones(2, requires_grad=True) * 1).mul_(it.ones(2, 2))


def test_in_place_on_an_expanded_view_is_refused_like_torch():
    for m in (it, torch):
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single"):
            m.ones(3).expand(2, 3).add_(1)


def test_in_place_device_mix_is_refused():
    with pytest.raises(ValueError, match="add_: expected all tensor inputs on one device, got inputs on cpu:1"):
        it.ones(2, device="cpu:1").add_(it.ones(2, device="cpu:2"))
    with pytest.raises(ValueError, match="expected all tensor inputs on one device"):
        (it.ones(2, device="cpu:1", requires_grad=True) * 1).add_(it.ones(2, device="cpu:2"))


def test_fill_zero_copy_and_random_fills():
    def run(m):
        x = m.tensor(X)
        x[0].fill_(2.5)
        x[1].zero_()
        x[2].copy_(m.tensor(ROW, dtype=m.float64))
        return x

    same(run)
    x = it.zeros(1000)
    x.uniform_(-2, 3)
    assert -2 <= x.min().item() and x.max().item() <= 3 and abs(x.mean().item() - 0.5) < 0.2
    with pytest.raises(RuntimeError, match="fill_: only supports a 0-dimension value tensor"):
        it.zeros(3).fill_(it.ones(3))
