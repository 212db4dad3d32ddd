"""it.autograd.grad and create_graph=True (double backward) against torch: first-order results, the API's
options and errors, second derivatives op family by op family, a gradient penalty, Hessian-vector products
(also against float64 finite differences), and a clear error from ops without double backward."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import assert_same, grads, same

RNG = np.random.default_rng(3)
X = RNG.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
Y = RNG.standard_normal((3, 4)).astype(np.float32)
V = RNG.standard_normal((3, 4)).astype(np.float32)
W1 = (RNG.standard_normal((5, 4)) * 0.5).astype(np.float32)
W2 = (RNG.standard_normal((2, 5)) * 0.5).astype(np.float32)


# ------------------------------------------------------------------------------------------ autograd.grad
def test_grad_first_order_matches_torch_and_leaves_dot_grad_alone():
    def run(m):
        x, y = m.tensor(X, requires_grad=True), m.tensor(Y, requires_grad=True)
        h = x * y
        out = (h.tanh() * 3).sum()
        gx, gh = m.autograd.grad(out, (x, h))
        return gx, gh, x.grad, y.grad

    ours = same(run)
    assert ours[2] is None and ours[3] is None


def test_grad_with_grad_outputs_and_several_outputs():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        a, b = x.exp(), x.sin()
        return m.autograd.grad([a, b], [x], grad_outputs=[m.tensor(V), m.ones(3, 4)])

    same(run)


def test_grad_allow_unused_and_materialize_grads():
    def run(m, **kw):
        x, unused = m.tensor(X, requires_grad=True), m.tensor(Y, requires_grad=True)
        return m.autograd.grad((x * 2).sum(), [x, unused], **kw)

    assert run(it, allow_unused=True)[1] is None
    same(lambda m: run(m, materialize_grads=True))
    for m in (it, torch):
        with pytest.raises(RuntimeError, match="not .*used in the graph"):
            run(m)


def test_grad_frees_the_graph_unless_retained():
    x = it.tensor(X, requires_grad=True)
    out = (x * x).sum()
    it.autograd.grad(out, x, retain_graph=True)
    it.autograd.grad(out, x)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        it.autograd.grad(out, x)


def test_grad_errors_are_clear():
    x = it.tensor(X, requires_grad=True)
    with pytest.raises(RuntimeError, match="grad: input 0 does not require grad"):
        it.autograd.grad((x * 2).sum(), it.ones(2))
    with pytest.raises(RuntimeError, match="grad: grad can be implicitly created only for scalar outputs"):
        it.autograd.grad(x * 2, x)
    with pytest.raises(ValueError, match="gradient is on meta, expected the output's device cpu"):
        (x * 2).backward(it.ones(x.shape, device="meta"))


def test_backward_with_inputs_accumulates_only_there():
    def run(m):
        x, y = m.tensor(X, requires_grad=True), m.tensor(Y, requires_grad=True)
        (x * y).sum().backward(inputs=[y])
        return x.grad, y.grad

    same(run)


# ----------------------------------------------------------------------------- second derivatives per op
UNARY = {
    "exp": lambda m, x: x.exp(), "log": lambda m, x: x.log(), "tanh": lambda m, x: x.tanh(),
    "sqrt": lambda m, x: x.sqrt(), "rsqrt": lambda m, x: x.rsqrt(), "sin": lambda m, x: x.sin(),
    "cos": lambda m, x: x.cos(), "abs": lambda m, x: (x - 1).abs() * x, "reciprocal": lambda m, x: x.reciprocal(),
    "neg_sub": lambda m, x: 2 - (-x) * x, "pow_scalar": lambda m, x: x ** 3, "pow_tensor": lambda m, x: x ** x,
    "rpow": lambda m, x: 2.0 ** x, "div": lambda m, x: 1 / (x * x + x), "clamp": lambda m, x: x.clamp(0.7, 1.2) * x,
    "maximum": lambda m, x: m.maximum(x, m.tensor(Y)) * x, "where": lambda m, x: m.where(x > 1, x * x, x.exp()),
    "sum": lambda m, x: (x * x).sum(1, keepdim=True) * x, "mean": lambda m, x: (x * x).mean(0) * x,
    "max_dim": lambda m, x: (x * x).max(1).values.unsqueeze(1) * x, "amax": lambda m, x: (x * x).amax() * x,
    "var": lambda m, x: (x * x).var(1, keepdim=True) * x, "std": lambda m, x: (x * x).std() * x,
    "softmax": lambda m, x: (x * x).softmax(-1), "log_softmax": lambda m, x: (x * x).log_softmax(0),
    "sigmoid": lambda m, x: (x * x).sigmoid(), "relu": lambda m, x: (x - 1).relu() * x,
    "gelu": lambda m, x: (m.nn.functional.gelu(x * x - 1)), "silu": lambda m, x: m.nn.functional.silu(x * x - 1),
    "gelu_tanh": lambda m, x: m.nn.functional.gelu(x * x - 1, approximate="tanh"),
    "softplus": lambda m, x: m.nn.functional.softplus(x * x - 1),
    "linear": lambda m, x: m.nn.functional.linear((x * x).tanh(), m.tensor(W1), m.tensor(W1[:, 0])),
    "views": lambda m, x: (x * x).t().reshape(2, 6).permute(1, 0).unsqueeze(0).expand(2, 6, 2).squeeze() * 1,
    "indexing": lambda m, x: (x * x)[1:, m.tensor([0, 2, 2])] * x[0, :3],
    "joins": lambda m, x: m.cat([x * x, m.stack([x[0] ** 3, x[1]])]).split(2)[1] * 2,
    "repeat_tril": lambda m, x: (x * x).repeat(2, 1).tril(-1).masked_fill(m.tensor(Y).repeat(2, 1) > 1, 0.5),
    "cast": lambda m, x: (x.double() ** 2).float() * x,
    "setitem": lambda m, x: _written(m, x),
}


def _written(m, x):
    buf = x * 1
    buf[1] = buf[1].clone() * x[2]
    buf[m.tensor([0, 2])] = x[:2] ** 2
    return buf


@pytest.mark.parametrize("name", list(UNARY))
def test_second_derivative_matches_torch(name):
    def run(m):
        x = m.tensor(X, requires_grad=True)
        out = UNARY[name](m, x)
        (g,) = m.autograd.grad((out * m.ones(out.shape)).sum(), x, create_graph=True)
        (gg,) = m.autograd.grad((g * m.tensor(V)).sum(), x)
        return g, gg

    same(run, rtol=2e-5, atol=1e-5)


def test_create_graph_backward_keeps_history_in_dot_grad():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        (x ** 3).sum().backward(create_graph=True)
        first = x.grad
        assert first.grad_fn is not None
        x.grad = None
        first.sum().backward()
        return first, x.grad

    same(run)


# ---------------------------------------------------------------------------------- uses of double backward
def _mlp(m, x, w1, w2):
    return m.nn.functional.linear(m.nn.functional.gelu(m.nn.functional.linear(x, w1)), w2)


def test_gradient_penalty_matches_torch():
    def run(m):
        w1, w2 = m.tensor(W1, requires_grad=True), m.tensor(W2, requires_grad=True)
        real, fake = m.tensor(X), m.tensor(Y)
        alpha = m.tensor(V[:, :1] * 0.5 + 0.5)
        mixed = (alpha * real + (1 - alpha) * fake).requires_grad_()
        score = _mlp(m, mixed, w1, w2)
        (g,) = m.autograd.grad(score.sum(), mixed, create_graph=True)
        penalty = (((g * g).sum(1) + 1e-12).sqrt() - 1) ** 2
        loss = _mlp(m, fake, w1, w2).mean() - _mlp(m, real, w1, w2).mean() + 10 * penalty.mean()
        loss.backward()
        return loss, grads(w1, w2)

    same(run, rtol=1e-5, atol=1e-6)


def _hvp(m, dtype, w1_values, vector):
    w1 = m.tensor(w1_values, dtype=dtype, requires_grad=True)
    x, w2 = m.tensor(X, dtype=dtype), m.tensor(W2, dtype=dtype)
    loss = ((_mlp(m, x, w1, w2) - 1) ** 2).mean() + (w1 * w1).sum() * 0.01
    (g,) = m.autograd.grad(loss, w1, create_graph=True)
    (hv,) = m.autograd.grad((g * m.tensor(vector, dtype=dtype)).sum(), w1)
    return g, hv


def test_hessian_vector_product_matches_torch_and_finite_differences():
    vector = RNG.standard_normal(W1.shape)
    same(lambda m: _hvp(m, m.float32, W1, vector.astype(np.float32)), rtol=1e-5, atol=1e-6)
    eps = 1e-6
    g_plus = _hvp(it, it.float64, W1.astype(np.float64) + eps * vector, vector)[0].numpy()
    g_minus = _hvp(it, it.float64, W1.astype(np.float64) - eps * vector, vector)[0].numpy()
    hv = _hvp(it, it.float64, W1.astype(np.float64), vector)[1].numpy()
    np.testing.assert_allclose(hv, (g_plus - g_minus) / (2 * eps), rtol=1e-6, atol=1e-7)


def test_custom_function_backward_is_differentiated_under_create_graph():
    class Cube(it.autograd.Function):
        def forward(self, x):
            return x * x * x

        def setup_context(self, inputs, output):
            self.save_for_backward(inputs[0])

        def backward(self, g):
            (x,) = self.saved_tensors
            return g * 3 * x * x

    x = it.tensor(X, requires_grad=True)
    (g,) = it.autograd.grad(Cube().apply(x).sum(), x, create_graph=True)
    (gg,) = it.autograd.grad(g.sum(), x)
    xt = torch.tensor(X, requires_grad=True)
    (gt,) = torch.autograd.grad((xt ** 3).sum(), xt, create_graph=True)
    assert_same((g, gg), (gt, torch.autograd.grad(gt.sum(), xt)[0]), rtol=1e-6)


def test_ops_without_double_backward_raise_a_clear_error():
    x = it.tensor(X, requires_grad=True)
    out = x.sort(0).values.sum()
    with pytest.raises(RuntimeError,
                       match="(?s)Sort: backward with create_graph=True .*not supported.*HINT"):
        it.autograd.grad(out, x, create_graph=True)
