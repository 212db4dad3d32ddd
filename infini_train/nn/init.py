"""Parameter initialisation with torch.nn.init's formulas: in place, under no_grad, drawing from the device's
generator (so ``it.manual_seed`` makes it reproducible), or from ``generator=`` (an ``it.Generator``, leaving the
global stream untouched) where torch takes one. Each function returns the tensor it filled."""
from __future__ import annotations

import math

from ..generator import draw_source
from ..autograd.grad_mode import no_grad

_LINEAR_GAINS = ("linear", "identity", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                 "conv_transpose3d", "sigmoid")


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch's table)."""
    if nonlinearity in _LINEAR_GAINS:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}; expected one of "
                     f"{list(_LINEAR_GAINS) + ['tanh', 'relu', 'leaky_relu', 'selu']}")


def _calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) = (shape[1], shape[0]) times the receptive field (product of shape[2:])."""
    if tensor.ndim < 2:
        raise ValueError(f"init: fan in and fan out need a tensor with at least 2 dims, got shape {tuple(tensor.shape)}"
                         "\nHINT: use normal_/uniform_/constant_ for biases and other 1-d tensors")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


@no_grad()
def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with U(a, b)."""
    return tensor.uniform_(a, b, generator=generator)


@no_grad()
def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with N(mean, std^2)."""
    return tensor.normal_(mean, std, generator=generator)


@no_grad()
def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Fill with N(mean, std^2) restricted to [a, b] (redraws the values that fall outside)."""
    if not a < b:
        raise ValueError(f"trunc_normal_: expected a < b, got a={a}, b={b}")
    gen = draw_source(generator, tensor.device, "trunc_normal_")
    values = gen.standard_normal(tensor.shape) * std + mean
    for _ in range(1000):
        outside = (values < a) | (values > b)
        count = int(outside.sum())
        if not count:
            break
        values[outside] = gen.standard_normal(count) * std + mean
    else:
        raise ValueError(f"trunc_normal_: [a, b] = [{a}, {b}] holds almost none of N({mean}, {std}^2)")
    return tensor.copy_(values)


@no_grad()
def constant_(tensor, value):
    return tensor.fill_(value)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """U(-b, b) with b = gain * sqrt(3 / fan) (He et al.); ``a`` is leaky_relu's negative slope."""
    fan = _fan(tensor, mode)
    if tensor.numel() == 0 or fan == 0:  # torch skips empty tensors too
        return tensor
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """N(0, std^2) with std = gain / sqrt(fan)."""
    fan = _fan(tensor, mode)
    if tensor.numel() == 0 or fan == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan), generator)


__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_", "ones_",
           "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"]
