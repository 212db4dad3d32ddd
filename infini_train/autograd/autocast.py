"""Autocast: ops run in a lower precision where that is safe, as torch.autocast.

``with it.autocast("cpu", it.bfloat16):`` (or "cuda", default float16 there) makes ``Function.apply`` cast the
floating inputs of listed ops before they run: the matmul family to the low dtype, precision-sensitive ops to
float32. Other ops run in their inputs' dtype, and mixed inputs promote as usual. Casts are autograd ops, so
gradients reach float32 leaves (master weights) in float32. A leaf that requires grad is cast once per region
(the cast cache, cleared when the outermost region exits). float64 tensors are never cast.

The state is thread-local, like grad mode: a thread started inside a region does not inherit it (DataParallel
re-applies it in its replica threads). Regions nest, ``enabled=False`` turns autocast off inside, and a guard
works as ``with`` or as a decorator (generator functions included).

The policy is one table per device type, each equal to torch's for that device type (``policy()``): on CUDA
softmax, layer_norm, rms_norm, exp/log, pow, sums and the losses run in float32; torch's CPU autocast forces
only the losses and reflection / replication padding to float32 and leaves softmax, layer_norm, rms_norm and the
reductions in their input's dtype (those kernels accumulate in float32 internally). An entry is LOW, FP32 or a
rule on the op (its arguments choose, as torch dispatches pad modes to separate kernels).
"""
from __future__ import annotations

import threading
import warnings

from .. import backend
from .grad_mode import _Guard

LOW, FP32 = "low", "fp32"
_DEFAULT_DTYPE = {"cpu": "bfloat16", "cuda": "float16"}


class _AutocastState(threading.local):
    def __init__(self):
        self.enabled = {"cpu": False, "cuda": False}
        self.dtype = {"cpu": backend.bfloat16, "cuda": backend.float16}
        self.cache_enabled = True
        self.active = False  # any device type enabled: the one check Function.apply makes when autocast is off
        self.depth = 0
        self.cache = {}  # (id(leaf), dtype) -> (leaf, its cast)


_state = _AutocastState()


def is_autocast_enabled(device_type="cuda"):
    """Whether autocast is on for ``device_type`` ("cpu" or "cuda") in this thread."""
    return _state.enabled[_device_type(device_type)]


def get_autocast_dtype(device_type):
    """The low dtype autocast uses for ``device_type`` ("cpu" or "cuda", required as in torch) in this thread."""
    return _state.dtype[_device_type(device_type)]


def _device_type(device_type):
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"autocast: expected device_type 'cpu' or 'cuda', got {device_type!r}\n"
                         "HINT: autocast('cpu', dtype=infini_train.bfloat16) or autocast('cuda')")
    return device_type


def snapshot():
    """This thread's autocast settings, to re-apply in another thread (see ``restore``)."""
    return dict(_state.enabled), dict(_state.dtype), _state.cache_enabled


def restore(settings):
    enabled, dtypes, cache_enabled = settings
    _state.enabled, _state.dtype, _state.cache_enabled = dict(enabled), dict(dtypes), cache_enabled
    _state.active = any(enabled.values())


class autocast(_Guard):
    """``autocast(device_type, dtype=None, enabled=True, cache_enabled=True)``: run the listed ops in ``dtype``
    (bfloat16 or float16; default bfloat16 on CPU, float16 on CUDA) inside the region."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=True):
        self.device_type = _device_type(device_type)
        dtype = backend.as_dtype(dtype or _DEFAULT_DTYPE[device_type])
        enabled = bool(enabled)
        if enabled and dtype not in (backend.bfloat16, backend.float16):  # torch warns and runs without autocast
            warnings.warn(f"In {device_type.upper()} autocast, but the target dtype {dtype} is not supported. "
                          f"Disabling autocast.\n{device_type.upper()} Autocast only supports dtypes of bfloat16, "
                          "float16 currently.", UserWarning, stacklevel=2)
            enabled = False
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = bool(cache_enabled)

    def _clone(self):
        return autocast(self.device_type, self.dtype, self.enabled, self.cache_enabled)

    def _enter(self):
        saved = snapshot()
        _state.enabled[self.device_type] = self.enabled
        _state.dtype[self.device_type] = self.dtype
        _state.cache_enabled = self.cache_enabled
        _state.active = any(_state.enabled.values())
        _state.depth += 1
        return saved

    def _exit(self, saved):
        restore(saved)
        _state.depth -= 1
        if _state.depth == 0:
            _state.cache.clear()


# ----------------------------------------------------------------------------------------------- the policy
_POLICIES = {}


def policy(device_type):
    """{Op class: LOW | FP32} for ``device_type``, torch's lists for that device type (built on first use)."""
    table = _POLICIES.get(device_type)
    if table is None:
        from .ops import (activations, attention, einsum, elementwise, linear, loss, matmul, normalization, reduction,
                          rms_norm, scan, softmax, statistics)
        from .ops import conv, fused_attention, fused_classifier

        low = [matmul.Matmul, matmul.Mm, matmul.Bmm, matmul.Baddbmm, linear.Linear, einsum.Einsum,
               attention.ScaledDotProductAttention, fused_attention.FusedAttention, conv.Conv2d]
        losses = [loss.CrossEntropy, fused_classifier.FusedCrossEntropy, loss.SoftCrossEntropy, loss.NLLLoss,
                  loss.MSELoss, loss.BinaryCrossEntropyWithLogits]
        fp32 = losses + [statistics.Prod]  # prod: CPU's float32 list, CUDA's fp32_set_opt_dtype list
        if device_type == "cuda":
            fp32 = fp32 + [softmax.Softmax, softmax.LogSoftmax, normalization.LayerNorm, elementwise.Exp,
                           elementwise.Log, elementwise.Pow, elementwise.Rsqrt, elementwise.Reciprocal,
                           activations.Softplus, reduction.Sum, scan.Cumsum, scan.Cumprod, rms_norm.RMSNorm,
                           statistics.VectorNorm]
        table = {cls: LOW for cls in low}
        table.update({cls: FP32 for cls in fp32})
        if device_type == "cpu":
            from .ops.padding import Pad

            table[Pad] = _cpu_pad_rule
        _POLICIES[device_type] = table
    return table


def _cpu_pad_rule(fn):
    """torch's CPU lists hold reflection_pad1d/2d and replication_pad1d/2d/3d (not reflection_pad3d, nor the constant
    and circular pads, which are not separate kernels)."""
    padded = len(fn.pad) // 2
    if (fn.mode == "reflect" and padded in (1, 2)) or (fn.mode == "replicate" and padded in (1, 2, 3)):
        return FP32
    return None


def _eligible(dtype):
    return dtype == backend.float32 or dtype == backend.float16 or dtype == backend.bfloat16


def cast_inputs(fn, inputs, device):
    """The inputs ``fn`` runs on under autocast on ``device`` (the same tuple when the policy leaves them)."""
    kind = device.type
    if not _state.enabled.get(kind):
        return inputs
    rule = policy(kind).get(type(fn))
    if rule is not None and rule is not LOW and rule is not FP32:  # a rule that depends on the op's arguments
        rule = rule(fn)
    if rule is None:
        return inputs
    from ..tensor import Tensor

    target = _state.dtype[kind] if rule == LOW else backend.float32
    return tuple(_cast(x, target) if isinstance(x, Tensor) and x.dtype != target and _eligible(x.dtype) else x
                 for x in inputs)


def _cast(t, dtype):
    from .ops.conversion import cast

    if not (_state.cache_enabled and t.grad_fn is None and t._requires_grad) or t.placement.flat_shard is not None:
        return cast(t, dtype)  # a fully_shard parameter's cast is redone in backward, never kept
    key = (id(t), dtype)
    hit = _state.cache.get(key)
    if hit is not None and hit[0] is t:
        return hit[1]
    out = cast(t, dtype)
    _state.cache[key] = (t, out)
    return out


__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype"]
