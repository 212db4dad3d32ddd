"""Functional forms of the layers (``it.nn.functional``, imported as F): thin wrappers over the autograd
op families, looked up at call time."""
from __future__ import annotations

from ..autograd.ops import activations, attention, elementwise, linear as _linear, loss, normalization
from ..autograd.ops import softmax as _softmax
from ..autograd.ops import dropout as _dropout
from ..autograd.ops import embedding as _embedding, padding
from ..autograd.ops import rms_norm as _rms_norm, rotary as _rotary
from ..autograd.ops import batch_norm as _batch_norm, conv as _conv, pooling as _pooling


def linear(x, weight, bias=None):
    """x @ weight.T + bias, with weight of shape (out_features, in_features)."""
    return _linear.linear(x, weight, bias)


def embedding(ids, weight, padding_idx=None):
    """Rows of ``weight`` picked by the integer ``ids``; the row ``padding_idx`` gets no gradient."""
    return _embedding.embedding(ids, weight, padding_idx)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing ``normalized_shape`` dims, then scale by weight and shift by bias."""
    return normalization.layer_norm(x, normalized_shape, weight, bias, eps)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """Divide by the root mean square over the trailing ``normalized_shape`` dims, then scale by weight;
    ``eps=None`` is float32's machine epsilon (float64's for float64 inputs)."""
    return _rms_norm.rms_norm(x, normalized_shape, weight, eps)


def rotary_embedding(x, cos, sin):
    """x * cos + rotate_half(x) * sin on the last dim (LLaMA's rotary position embedding); cos and sin are
    constants that broadcast against x (..., T, head_dim)."""
    return _rotary.rotary_embedding(x, cos, sin)


def gelu(x, approximate="none"):
    """GELU: exact x * Phi(x), or the tanh approximation (GPT-2's) with approximate="tanh"."""
    return activations.gelu(x, approximate=approximate)


def relu(x):
    return activations.relu(x)


def sigmoid(x):
    return activations.sigmoid(x)


def silu(x):
    return activations.silu(x)


def softplus(x, beta=1.0, threshold=20.0):
    return activations.softplus(x, beta, threshold)


def tanh(x):
    return elementwise.tanh(x)


def softmax(x, dim=-1):
    return _softmax.softmax(x, dim)


def log_softmax(x, dim=-1):
    return _softmax.log_softmax(x, dim)


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Softmax cross entropy of (N, C), (C,) or (N, C, d1, ...) logits against class indices (targets equal to
    ``ignore_index`` count neither in the sum nor in the mean's denominator) or class probabilities (a float
    target of the input's shape), with optional class ``weight`` and ``label_smoothing``, as torch."""
    return loss.cross_entropy(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                              label_smoothing=label_smoothing)


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """Negative log-likelihood of class indices given log-probabilities, with optional class ``weight``."""
    return loss.nll_loss(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction)


def mse_loss(input, target, reduction="mean"):
    """Mean squared error between input and target (which broadcast, with a warning when their shapes differ)."""
    return loss.mse_loss(input, target, reduction=reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """Binary cross-entropy of logits against targets in [0, 1], numerically stable; ``weight`` and
    ``pos_weight`` (the weight of positive targets, e.g. one per class) broadcast to the input's shape."""
    return loss.binary_cross_entropy_with_logits(input, target, weight=weight, reduction=reduction,
                                                 pos_weight=pos_weight)


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity when not training."""
    return _dropout.dropout(x, p, training)


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, sinks=None, sliding_window=None):
    """softmax(q k^T * scale + mask) v over (..., T, head_dim) inputs; ``is_causal`` masks future positions;
    ``enable_gqa`` lets k and v have fewer heads than q (grouped-query attention); ``sinks`` (heads,) adds a learned
    logit per head to each row's softmax denominator (attention sinks, gpt-oss); ``sliding_window`` keeps query i to
    the keys j > i - sliding_window (see autograd/ops/attention.py)."""
    return attention.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                                  sinks=sinks, sliding_window=sliding_window)


def pad(x, pad, mode="constant", value=0.0):
    """Pad (or, with negative sizes in constant mode, crop) the trailing dims: ``pad`` lists (before, after)
    sizes starting from the last dim; modes 'constant', 'reflect', 'replicate', 'circular'."""
    return padding.pad(x, pad, mode=mode, value=value)


def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding of integer class indices, with a new last dim of ``num_classes`` (max + 1 if -1)."""
    return _embedding.one_hot(tensor, num_classes)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution of (N, C, H, W) by weight (O, C / groups, kH, kW) plus bias (O,); padding is an int, a
    pair, "valid" or "same"."""
    return _conv.conv2d(input, weight, bias, stride, padding, dilation, groups)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over kernel windows of (N, C, H, W) (stride defaults to kernel_size); with return_indices also the
    flat positions h * W + w of the maxima."""
    return _pooling.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Mean over kernel windows of (N, C, H, W), with torch's divisor rules."""
    return _pooling.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """Per-channel normalisation of (N, C, ...): batch statistics in training (running ones updated in place),
    running statistics otherwise."""
    return _batch_norm.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def flatten(input, start_dim=0, end_dim=-1):
    """Merge dims start_dim..end_dim into one (torch.flatten)."""
    return input.flatten(start_dim, end_dim)


__all__ = ["pad", "one_hot", "linear", "embedding", "layer_norm", "gelu", "relu", "sigmoid", "silu", "softplus",
           "tanh", "softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss",
           "binary_cross_entropy_with_logits", "dropout", "scaled_dot_product_attention", "rms_norm",
           "rotary_embedding", "conv2d", "max_pool2d", "avg_pool2d", "batch_norm", "flatten"]
