"""Layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, activations, Identity (the losses are in loss.py).

Default initialisation and ``repr`` follow torch.nn, so the same seedless structure prints the same.
"""
from __future__ import annotations

import math

from .. import backend
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module, Parameter


def _param(*shape, device=None, dtype=None):
    dev = backend.Device.parse(device)
    xp = dev.array_module()
    with dev.context():
        array = xp.empty(shape, dtype=backend.as_dtype(dtype) or backend.get_default_dtype())
    return Parameter(Tensor._make(array, dev))  # via a Tensor: keeps logical devices ("cpu:1")


class Linear(Module):
    """y = x @ weight.T + bias; weight is (out_features, in_features), initialised like torch
    (kaiming_uniform with a=sqrt(5), bias uniform in +-1/sqrt(in_features))."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = _param(out_features, in_features, device=device, dtype=dtype)
        if bias:
            self.bias = _param(out_features, device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table of ``num_embeddings`` rows of size ``embedding_dim``, initialised N(0, 1); the row
    ``padding_idx`` (if given) starts at zero and receives no gradient."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, device=None, dtype=None, _weight=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be within [-{num_embeddings}, {num_embeddings}), "
                                 f"got {padding_idx}")
            padding_idx = padding_idx % num_embeddings
        self.padding_idx = padding_idx
        if _weight is not None:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight must have shape {(num_embeddings, embedding_dim)}, "
                                 f"got {tuple(_weight.shape)}")
            self.weight = _weight if isinstance(_weight, Parameter) else Parameter(_weight)
        else:
            self.weight = _param(num_embeddings, embedding_dim, device=device, dtype=dtype)
            self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None and self.weight.device is not backend.META:  # (meta: shapes only)
            self.weight.array[self.padding_idx] = 0

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None):
        """An Embedding holding a copy-free Parameter over ``embeddings`` (a 2-D Tensor or array)."""
        rows, dim = embeddings.shape
        emb = cls(rows, dim, padding_idx=padding_idx, _weight=Parameter(embeddings, requires_grad=not freeze))
        return emb

    def forward(self, ids):
        return F.embedding(ids, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dims; weight starts at ones, bias at zeros."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (int(normalized_shape),) if isinstance(normalized_shape, int) \
            else tuple(int(s) for s in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        with_weight, with_bias = elementwise_affine, elementwise_affine and bias
        self.register_parameter("weight", _param(*self.normalized_shape, device=device, dtype=dtype)
                                if with_weight else None)
        self.register_parameter("bias", _param(*self.normalized_shape, device=device, dtype=dtype)
                                if with_bias else None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """Divide by the root mean square over the trailing ``normalized_shape`` dims; weight starts at ones.
    ``eps=None`` is float32's machine epsilon (float64's for float64 inputs), as torch.nn.RMSNorm."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        self.normalized_shape = (int(normalized_shape),) if isinstance(normalized_shape, int) \
            else tuple(int(s) for s in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.register_parameter("weight", _param(*self.normalized_shape, device=device, dtype=dtype)
                                if elementwise_affine else None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    """Zeroes elements with probability p while ``training`` (scaling the rest by 1/(1-p)); identity in eval.
    ``inplace`` is accepted for torch compatibility; the output is always a new tensor."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: expected p in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class SiLU(Module):
    def forward(self, x):
        return F.silu(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, x):
        return F.log_softmax(x, self.dim)


class Identity(Module):
    """Returns its input; extra constructor arguments are ignored (as torch's)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x

