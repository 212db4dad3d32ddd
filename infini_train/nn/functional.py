"""Functional forms of the layers (it.nn.functional / F), from the autograd op families."""
from ..autograd.activations import gelu, relu, sigmoid, silu, softplus
from ..autograd.attention import scaled_dot_product_attention
from ..autograd.dropout import dropout
from ..autograd.elementwise import tanh
from ..autograd.linear import linear
from ..autograd.loss import cross_entropy, nll_loss
from ..autograd.normalization import layer_norm
from ..autograd.softmax import log_softmax, softmax
from ..autograd.sparse import embedding

__all__ = ["gelu", "relu", "sigmoid", "silu", "softplus", "tanh", "scaled_dot_product_attention", "dropout",
           "linear", "cross_entropy", "nll_loss", "layer_norm", "log_softmax", "softmax", "embedding"]
