"""rotary_embedding against torch 2.13 running Hugging Face's ``apply_rotary_pos_emb`` formula
(q * cos + rotate_half(q) * sin): forward and gradients bit for bit in float32, float64, bfloat16 and float16
(torch's eager op-by-op rounding), mixed dtypes, broadcasting layouts, float64 finite differences, double
backward, and the errors."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.rotary import RotaryEmbedding
from tests.autograd.test_low_precision import LOW, assert_ulps, from_torch, to_torch
from tests.op_check import check_finite_differences

F = it.nn.functional


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def torch_rotary(x, cos, sin):
    return (x * cos) + (rotate_half(x) * sin)


def rope_tables(positions, head_dim, base=10000.0):
    """cos and sin as LLaMA's rotary embedding builds them: (len(positions), head_dim), float32."""
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    freqs = np.asarray(positions, np.float32)[:, None] * inv_freq[None, :].astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def run_both(x, cos, sin, cot):
    """Output and x's gradient from infini_train and from torch (numpy arrays, torch's bits kept)."""
    xi = it.tensor(x, requires_grad=True)
    yi = F.rotary_embedding(xi, it.tensor(cos), it.tensor(sin))
    yi.backward(it.tensor(cot.astype(yi.array.dtype)))
    xt = to_torch(x).requires_grad_(True)
    yt = torch_rotary(xt, to_torch(cos), to_torch(sin))
    yt.backward(to_torch(cot.astype(yi.array.dtype)))
    return (yi.numpy(), xi.grad.numpy()), (from_torch(yt), from_torch(xt.grad))


# layouts: x (B, n_heads, T, head_dim) with cos/sin (T, head_dim) or (B, 1, T, head_dim); x (T, head_dim);
# cos and sin of different (broadcastable) shapes
LAYOUTS = {
    "BHTD_TD": ((2, 3, 5, 8), (5, 8), (5, 8)),
    "BHTD_B1TD": ((2, 3, 5, 8), (2, 1, 5, 8), (2, 1, 5, 8)),
    "TD_TD": ((7, 16), (7, 16), (7, 16)),
    "cos_sin_differ": ((2, 4, 3, 6), (3, 6), (2, 1, 3, 6)),
}


def _arrays(layout, dtype, seed=0, cos_dtype=None):
    rng = np.random.default_rng(seed)
    x_shape, cos_shape, sin_shape = LAYOUTS[layout]
    x = rng.standard_normal(x_shape).astype(np.float32).astype(dtype)
    angle_cos = rng.uniform(-3, 3, cos_shape).astype(np.float32)
    angle_sin = rng.uniform(-3, 3, sin_shape).astype(np.float32)
    cos_dtype = cos_dtype or dtype
    cos = np.cos(angle_cos).astype(cos_dtype)
    sin = np.sin(angle_sin).astype(cos_dtype)
    cot = rng.standard_normal(np.broadcast_shapes(x_shape, cos_shape, sin_shape)).astype(np.float32)
    return x, cos, sin, cot


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_hf_apply_rotary_pos_emb_bit_for_bit(layout, dtype):
    # float16/bfloat16: torch rounds x * cos, rotate_half(x) * sin and their sum each to the low dtype, and its
    # autograd rounds g * cos and g * sin before adding them into x's gradient: the op rounds the same way
    dtype = getattr(it, dtype)
    x, cos, sin, cot = _arrays(layout, dtype)
    (y, gx), (yt, gxt) = run_both(x, cos, sin, cot)
    assert y.dtype == yt.dtype == dtype and gx.dtype == gxt.dtype == dtype
    np.testing.assert_array_equal(y.view(np.uint8), yt.view(np.uint8))
    np.testing.assert_array_equal(gx.view(np.uint8), gxt.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_llama_tables_and_a_bfloat16_run_differs_from_rounding_once(dtype):
    dtype = getattr(it, dtype)
    cos, sin = rope_tables(np.arange(64), 32)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 4, 64, 32)) * 3).astype(np.float32).astype(dtype)
    cot = rng.standard_normal(x.shape).astype(np.float32)
    (y, gx), (yt, gxt) = run_both(x, cos.astype(dtype), sin.astype(dtype), cot)
    np.testing.assert_array_equal(y.view(np.uint8), yt.view(np.uint8))
    np.testing.assert_array_equal(gx.view(np.uint8), gxt.view(np.uint8))
    if dtype != it.float32:  # a single rounding of the float32 result would differ from torch somewhere
        x32, cos32, sin32 = (a.astype(dtype).astype(np.float32) for a in (x, cos, sin))
        wide = x32 * cos32 + from_torch(rotate_half(torch.from_numpy(x32))) * sin32
        assert (wide.astype(dtype) != y).any()


@pytest.mark.parametrize("x_dtype,table_dtype", [("bfloat16", "float32"), ("float32", "bfloat16"),
                                                 ("float16", "float32"), ("float16", "bfloat16"),
                                                 ("float32", "float64")])
def test_mixed_dtypes_promote_as_torch(x_dtype, table_dtype):
    x, cos, sin, cot = _arrays("BHTD_TD", getattr(it, x_dtype), seed=2, cos_dtype=getattr(it, table_dtype))
    (y, gx), (yt, gxt) = run_both(x, cos, sin, cot)
    assert y.dtype == yt.dtype and gx.dtype == gxt.dtype == x.dtype
    np.testing.assert_array_equal(y.view(np.uint8), yt.view(np.uint8))
    np.testing.assert_array_equal(gx.view(np.uint8), gxt.view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_x_broadcast_by_cos_and_sin_sums_its_gradient(dtype):
    # x (n_heads, T, head_dim) against cos/sin (B, 1, T, head_dim): the output is (B, n_heads, T, head_dim)
    # and x's gradient sums over B
    dtype = getattr(it, dtype)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32).astype(dtype)
    angles = rng.uniform(-3, 3, (2, 1, 5, 8)).astype(np.float32)
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    cot = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)
    (y, gx), (yt, gxt) = run_both(x, cos, sin, cot)
    assert y.shape == (2, 3, 5, 8) and gx.shape == x.shape
    np.testing.assert_array_equal(y.view(np.uint8), yt.view(np.uint8))
    if dtype in (it.float32, it.float64):
        np.testing.assert_allclose(gx, gxt, rtol=1e-6, atol=1e-6)
    else:  # float32 sums in another order can round to the neighbouring low-precision value
        assert_ulps(gx, gxt, str(dtype), ulps=1)


def test_cos_sin_constants_and_the_output_of_other_ops():
    cos, sin = rope_tables(np.arange(4), 6)
    x = it.tensor(np.random.default_rng(4).standard_normal((2, 4, 6)).astype(np.float32), requires_grad=True)
    y = F.rotary_embedding(x * 2, it.tensor(cos), it.tensor(sin))
    assert isinstance(y.grad_fn, RotaryEmbedding) and y.grad_fn.needs_input_grad == (True, False, False)
    y.sum().backward()
    xt = torch.tensor(x.numpy(), requires_grad=True)
    torch_rotary(xt * 2, torch.tensor(cos), torch.tensor(sin)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())
    # the rotation preserves norms pairwise: |y_i|^2 + |y_{i+d/2}|^2 = |x_i|^2 + |x_{i+d/2}|^2
    with it.no_grad():
        z = F.rotary_embedding(x, it.tensor(cos), it.tensor(sin)).numpy()
    xs = x.numpy()
    np.testing.assert_allclose(z[..., :3] ** 2 + z[..., 3:] ** 2, xs[..., :3] ** 2 + xs[..., 3:] ** 2, rtol=1e-5)


# ------------------------------------------------------------------------------------- finite differences
@pytest.mark.parametrize("layout", ["BHTD_TD", "cos_sin_differ"])
def test_float64_gradient_against_finite_differences(layout):
    x, cos, sin, _ = _arrays(layout, np.float64, seed=5)
    check_finite_differences(lambda x, c, s: F.rotary_embedding(x, c, s), [x, cos, sin], [True, False, False])


def test_float64_gradient_of_a_broadcast_x_against_finite_differences():
    rng = np.random.default_rng(6)
    x, angles = rng.standard_normal((3, 4, 6)), rng.uniform(-3, 3, (2, 1, 4, 6))
    check_finite_differences(lambda x, c, s: F.rotary_embedding(x, c, s) ** 2,
                             [x, np.cos(angles), np.sin(angles)], [True, False, False])


# ---------------------------------------------------------------------------------------- double backward
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_double_backward_matches_torch(dtype):
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 2, 4, 8)), rng.standard_normal((2, 2, 4, 8))
    cos, sin = rope_tables(np.arange(4), 8)
    v = rng.standard_normal((2, 2, 4, 8))

    def run(m, rotary):
        d = getattr(m, dtype)
        qs, ks = m.tensor(q, dtype=d, requires_grad=True), m.tensor(k, dtype=d, requires_grad=True)
        c, s = m.tensor(cos, dtype=d), m.tensor(sin, dtype=d)
        scores = rotary(qs, c, s) @ rotary(ks, c, s).transpose(-1, -2)
        loss = (scores.tanh() ** 2).sum()
        gq, gk = m.autograd.grad(loss, (qs, ks), create_graph=True)
        probe = (gq * m.tensor(v, dtype=d)).sum() + (gk * gk).sum()
        return [t.detach().numpy() for t in (gq, gk) + m.autograd.grad(probe, (qs, ks))]

    tol = 1e-12 if dtype == "float64" else 1e-5
    for a, b in zip(run(it, F.rotary_embedding), run(torch, torch_rotary)):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_double_backward_of_a_broadcast_x_against_finite_differences():
    rng = np.random.default_rng(8)
    x, angles = rng.standard_normal((3, 4, 6)), rng.uniform(-3, 3, (2, 1, 4, 6))
    cos, sin, cot, v = np.cos(angles), np.sin(angles), rng.standard_normal((2, 3, 4, 6)), rng.standard_normal(x.shape)

    def gradient(values):
        xs = it.tensor(values, requires_grad=True)
        y = F.rotary_embedding(xs, it.tensor(cos), it.tensor(sin))
        (g,) = it.autograd.grad((y * y * it.tensor(cot)).sum(), xs, create_graph=True)
        return xs, g

    xs, g = gradient(x)
    (hv,) = it.autograd.grad((g * it.tensor(v)).sum(), xs)
    eps = 1e-6
    numeric = ((gradient(x + eps * v)[1].numpy() - gradient(x - eps * v)[1].numpy()) / (2 * eps))
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-6, atol=1e-7)  # the Hessian is symmetric


# ------------------------------------------------------------------------------------------------ errors
def test_errors_name_the_op_expected_received_and_a_hint():
    cos, sin = it.ones(5, 8), it.zeros(5, 8)
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected x of shape \(\.\.\., T, head_dim\) with an "
                                         r"even head_dim, got x of shape \(5, 7\)\nHINT: rotate_half pairs"):
        F.rotary_embedding(it.ones(5, 7), it.ones(5, 7), it.ones(5, 7))
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected cos with last dim 8 \(= x's head_dim\), "
                                         r"got cos of shape \(5, 4\)\nHINT: build cos/sin as \(T, head_dim\)"):
        F.rotary_embedding(it.ones(2, 5, 8), it.ones(5, 4), sin)
    with pytest.raises(ValueError, match=r"rotary_embedding: expected sin with last dim 8 .* of shape \(5, 16\)"):
        F.rotary_embedding(it.ones(2, 5, 8), cos, it.ones(5, 16))
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected x, cos and sin of broadcastable shapes, got "
                                         r"x \(2, 3, 5, 8\), cos \(4, 8\), sin \(5, 8\)\nHINT: for x \(B, n_heads"):
        F.rotary_embedding(it.ones(2, 3, 5, 8), it.ones(4, 8), sin)
    with pytest.raises(ValueError, match="(?s)rotary_embedding: expected a floating-point x, got x of dtype int64"
                                         ".*HINT"):
        F.rotary_embedding(it.tensor(np.ones((5, 8), np.int64)), cos, sin)
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected x of shape .*, got x of shape \(\)"):
        F.rotary_embedding(it.tensor(1.0), cos, sin)
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected cos as a Tensor, got cos of type ndarray"
                                         r".*HINT: wrap it first"):
        F.rotary_embedding(it.ones(5, 8), np.ones((5, 8), np.float32), sin)


def test_cos_or_sin_that_require_grad_are_refused_while_grad_is_enabled():
    x, cos, sin = it.ones(5, 8, requires_grad=True), it.ones(5, 8), it.zeros(5, 8)
    learnable = it.ones(5, 8, requires_grad=True)
    with pytest.raises(ValueError, match=r"(?s)rotary_embedding: expected cos that does not require grad \(cos and "
                                         r"sin are constants here\), got cos with requires_grad=True\n"
                                         r"HINT: compute cos/sin under no_grad\(\), or pass cos.detach\(\)"):
        F.rotary_embedding(x, learnable, sin)
    with pytest.raises(ValueError, match=r"(?s)expected sin that does not require grad .* sin.detach\(\)"):
        F.rotary_embedding(x, cos, learnable)
    with it.no_grad():  # no graph, nothing to refuse
        y = F.rotary_embedding(x, learnable, learnable)
    np.testing.assert_array_equal(y.numpy(), np.repeat([[0.0] * 4 + [2.0] * 4], 5, 0))  # (x1 - x2, x2 + x1)
    F.rotary_embedding(x, learnable.detach(), sin).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((5, 8), np.float32))


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize("dtype", ["float32"] + LOW)
def test_rotary_on_cuda_matches_cpu(dtype):
    cos, sin = rope_tables(np.arange(16), 32)
    rng = np.random.default_rng(9)
    x, cot = rng.standard_normal((2, 4, 16, 32)), rng.standard_normal((2, 4, 16, 32))
    results = []
    for device in ("cpu", "cuda:0"):
        xs = it.tensor(x.astype(np.float32), device=device).to(dtype).requires_grad_(True)
        y = F.rotary_embedding(xs, it.tensor(cos, device=device).to(dtype), it.tensor(sin, device=device).to(dtype))
        y.backward(it.tensor(cot.astype(np.float32), device=device).to(dtype))
        results.append([t.float().numpy() for t in (y, xs.grad)])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
