"""Double backward (create_graph=True) of the ops gradient penalties, input-gradient regularisers and MAML reach:
layer norm, RMS norm, cross-entropy (class indices and probabilities), nll_loss, MSE, BCE-with-logits, embedding,
conv2d, max/avg pooling, attention (causal, masks, GQA, dropout-free), einsum (diagonals too), pad (every mode) and
cumsum. Each against torch 2.13's second derivatives, and in float64 against central finite differences of the
first gradient (gradgradcheck-style)."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.torch_parity import same

RNG = np.random.default_rng(21)
IMG = RNG.standard_normal((2, 3, 6, 5))
SEQ = RNG.standard_normal((2, 4, 5, 8))  # (batch, heads, time, head dim)
W_CONV = RNG.standard_normal((4, 3, 3, 2)) * 0.4
W_EMB = RNG.standard_normal((7, 5))
IDS = np.array([[1, 3, 3], [0, 6, 1]])
TARGETS = np.array([2, 0, 3, 3, 1, 0])
FLOAT_MASK = RNG.standard_normal((5, 5))
MASK = RNG.random((5, 5)) > 0.3
np.fill_diagonal(MASK, True)


T3 = np.random.default_rng(3).integers(0, 4, (2, 6, 5))


def F(m):
    return m.nn.functional


def sdpa(m, q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Ours, or torch's attention written out (torch's CPU kernel has no double backward)."""
    if m is it:
        return F(m).scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                                 enable_gqa=enable_gqa)
    if enable_gqa:
        k, v = (a.repeat_interleave(q.shape[-3] // a.shape[-3], dim=-3) for a in (k, v))
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return scores.softmax(-1) @ v


CASES = {  # name: (input, fn(m, x) -> a tensor built from x)
    "layer_norm": (IMG, lambda m, x: F(m).layer_norm(x, (6, 5), m.tensor(IMG[0, 0] + 1.5), m.tensor(IMG[1, 1]))),
    "layer_norm_no_affine": (IMG, lambda m, x: F(m).layer_norm(x * x, (5,))),
    "rms_norm": (IMG, lambda m, x: F(m).rms_norm(x, (5,), m.tensor(IMG[0, 0, 0] + 2))),
    "cross_entropy": (IMG[:, :, 0, :4].reshape(6, 4), lambda m, x: F(m).cross_entropy(x * x, m.tensor(TARGETS))),
    "cross_entropy_options": (IMG[:, :, 0, :4].reshape(6, 4), lambda m, x: F(m).cross_entropy(
        x, m.tensor(np.where(TARGETS == 0, -1, TARGETS)), weight=m.tensor([0.5, 1.0, 2.0, 1.5], dtype=m.float64),
        ignore_index=-1, label_smoothing=0.2)),
    "cross_entropy_3d_none": (IMG[:, :3], lambda m, x: F(m).cross_entropy(x, m.tensor(T3 % 3), reduction="none")),
    "cross_entropy_soft": (IMG[:, :, 0, :4].reshape(6, 4), lambda m, x: F(m).cross_entropy(
        x * x, (x * 0.5).softmax(1), weight=m.tensor([0.5, 1.0, 2.0, 1.5], dtype=m.float64), label_smoothing=0.1)),
    "cross_entropy_soft_3d_none": (IMG[:, :3], lambda m, x: F(m).cross_entropy(x, x.tanh().softmax(1),
                                                                              reduction="none")),
    "nll_loss": (IMG[:, :, 0, :4].reshape(6, 4), lambda m, x: F(m).nll_loss(
        (x * x).log_softmax(1), m.tensor(np.where(TARGETS == 0, -100, TARGETS)),
        weight=m.tensor([0.5, 1.0, 2.0, 1.5], dtype=m.float64))),
    "nll_loss_3d_sum": (IMG[:, :3], lambda m, x: F(m).nll_loss(x.log_softmax(1), m.tensor(T3 % 3), reduction="sum")),
    "mse": (IMG, lambda m, x: F(m).mse_loss(x * x, m.tensor(IMG[::-1].copy()))),
    "mse_sum": (IMG, lambda m, x: F(m).mse_loss(x.tanh(), x.exp(), reduction="sum")),
    "bce_logits": (IMG, lambda m, x: F(m).binary_cross_entropy_with_logits(
        x * 2, m.tensor((IMG > 0).astype(np.float64)), pos_weight=m.tensor([1.5, 0.5, 2.0, 1.0, 3.0],
                                                                            dtype=m.float64))),
    "embedding": (W_EMB, lambda m, x: F(m).embedding(m.tensor(IDS), x * x)),
    "embedding_padding": (W_EMB, lambda m, x: F(m).embedding(m.tensor(IDS), x.tanh(), padding_idx=3)),
    "conv2d": (IMG, lambda m, x: F(m).conv2d(x, m.tensor(W_CONV))),
    "conv2d_options": (IMG, lambda m, x: F(m).conv2d(x * x, m.tensor(np.concatenate([W_CONV[:2, :1]] * 3)),
                                                      m.tensor(np.arange(6) * 0.1), stride=(2, 1), padding=1,
                                                      dilation=(1, 2), groups=3)),
    "max_pool2d": (IMG, lambda m, x: F(m).max_pool2d(x * x, 2, stride=1, padding=1)),
    "avg_pool2d": (IMG, lambda m, x: F(m).avg_pool2d(x * x, (3, 2), stride=2, padding=1, count_include_pad=False)),
    "sdpa_causal": (SEQ, lambda m, x: sdpa(m, x, x * 0.5, x.tanh(), is_causal=True)),
    "sdpa_bool_mask": (SEQ, lambda m, x: sdpa(m, x, x, x, attn_mask=m.tensor(MASK))),
    "sdpa_float_mask_gqa": (SEQ, lambda m, x: sdpa(m, x, x[:, :2] * 2, x[:, 2:], attn_mask=m.tensor(FLOAT_MASK),
                                                   enable_gqa=True, scale=0.3)),
    "einsum": (IMG, lambda m, x: m.einsum("nchw,nkhw->nck", x, x * x)),
    "einsum_ellipsis_lone": (IMG, lambda m, x: m.einsum("...ij,...jk->...ik", x[..., :5], x.tanh()[..., :5, :])
                             + m.einsum("nchw->n", x)[:, None, None, None]),
    "einsum_diagonal": (IMG[0, 0, :5, :5], lambda m, x: m.einsum("ii->i", x * x) + m.einsum("ii", x.tanh())),
    "einsum_diagonal_contract": (IMG[0, :2, :2, :4], lambda m, x: m.einsum("iij,jk->ik", x, (x * x)[0, :, :, None]
                                                                          .reshape(4, 2))),
    "pad_constant": (IMG, lambda m, x: F(m).pad(x * x, (1, 2, 0, 1), value=0.5)),
    "pad_reflect": (IMG, lambda m, x: F(m).pad(x * x, (2, 1, 1, 2), mode="reflect")),
    "pad_replicate": (IMG[0], lambda m, x: F(m).pad(x * x, (2, 1), mode="replicate")),
    "pad_circular": (IMG, lambda m, x: F(m).pad(x * x, (1, 2, 2, 0), mode="circular")),
    "cumsum": (IMG, lambda m, x: (x * x).cumsum(2)),
}


def _second(m, name, x_array, v):
    x = m.tensor(x_array, requires_grad=True)
    out = CASES[name][1](m, x)
    (g,) = m.autograd.grad((out * out).sum(), x, create_graph=True)
    (gg,) = m.autograd.grad((g * m.tensor(v)).sum(), x)
    return g, gg


@pytest.mark.parametrize("name", list(CASES))
def test_second_derivatives_match_torch(name):
    x = CASES[name][0]
    v = np.random.default_rng(1).standard_normal(x.shape)
    same(lambda m: _second(m, name, x, v), rtol=1e-7, atol=1e-9)


FD_CASES = ["layer_norm", "cross_entropy_options", "cross_entropy_soft", "nll_loss", "einsum_diagonal_contract",
            "bce_logits", "embedding_padding", "conv2d_options", "max_pool2d", "avg_pool2d", "sdpa_causal",
            "sdpa_float_mask_gqa", "einsum_ellipsis_lone", "pad_reflect", "cumsum"]


@pytest.mark.parametrize("name", FD_CASES)
def test_second_derivatives_match_finite_differences(name):
    """d/dx (g(x) . v), the directional derivative of the first gradient, against central differences of g."""
    x0 = CASES[name][0]
    rng = np.random.default_rng(2)
    v, direction = rng.standard_normal(x0.shape), rng.standard_normal(x0.shape)

    def first_gradient(x_array):
        x = it.tensor(x_array, requires_grad=True)
        out = CASES[name][1](it, x)
        (g,) = it.autograd.grad((out * out).sum(), x)
        return g.numpy()

    _, gg = _second(it, name, x0, v)
    eps = 1e-6
    numeric = ((first_gradient(x0 + eps * direction) - first_gradient(x0 - eps * direction)) * v).sum() / (2 * eps)
    np.testing.assert_allclose((gg.numpy() * direction).sum(), numeric, rtol=1e-5, atol=1e-6)


def test_the_first_order_backward_still_uses_the_kernels():
    """A backward without create_graph records nothing (the fast numeric path)."""
    x = it.tensor(IMG, requires_grad=True)
    out = it.nn.functional.conv2d(x, it.tensor(W_CONV))
    (g,) = it.autograd.grad(out.sum(), x)
    assert g.grad_fn is None and not g.requires_grad
