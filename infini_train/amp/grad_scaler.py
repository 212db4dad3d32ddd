"""GradScaler: dynamic loss scaling for mixed-precision training, with torch.amp.GradScaler's semantics.

    scaler = GradScaler()
    scaler.scale(loss).backward()   # gradients come out multiplied by the scale
    scaler.unscale_(opt)            # optional: unscale now to clip or inspect the gradients
    scaler.step(opt)                # unscales if not done yet; skips opt.step() if any gradient is inf/nan
    scaler.update()                 # back off after a skipped step, grow after growth_interval clean ones

The scale is a float32 value and the growth tracker an int, both kept on the host: ``update`` reads the
found-inf flags anyway, and a host value makes ``get_scale`` free. Each gradient costs one finiteness
reduction and one in-place multiply on its own device; the flags stay on the device until ``step`` or
``update`` needs them (one sync per optimizer). Under data parallelism the flag is all-reduced (MAX) over
the process group, so every rank skips the same steps and keeps the same scale.
"""
from __future__ import annotations

import warnings

import numpy as np

from .. import backend
from .. import distributed as dist
from ..autograd.function import Op
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
_NO_SCALE_HINT = "HINT: call scaler.scale(loss) (and backward the result) earlier in the iteration"


def _compute_dtype(dtype):
    """float32 for float16/bfloat16 (torch's opmath), else ``dtype``; integer inputs compute in float32."""
    return dtype if backend.is_floating(dtype) and dtype.itemsize >= 4 else backend.float32


def _float32(value):
    """``value`` rounded to float32, as torch's float32 scale tensor holds it."""
    return float(np.float32(value))


class _MulByScale(Op):
    """``x * scale`` computed in float32 at least and rounded once to x's floating dtype: torch multiplies by a
    float32 0-d tensor, so a float16 output times 2**16 is finite where the product fits in float16."""

    def __init__(self, scale):
        self.scale = scale

    def forward(self, x):
        compute = _compute_dtype(x.dtype)
        out = self.xp.empty(x.shape, x.dtype if backend.is_floating(x.dtype) else compute)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow gives inf, as in torch (cupy never warns)
            return self.xp.multiply(x, self.scale, out=out, dtype=compute, casting="unsafe")

    def backward(self, g):
        return self.forward(g)

    def backward_graph(self, g):
        return _MulByScale(self.scale).apply(g)


def _check_and_unscale_(grad, inv_scale):
    """torch's ``_amp_foreach_non_finite_check_and_unscale_`` for one gradient Tensor: returns a 0-d bool device
    array, True when some element is inf or nan (checked before unscaling, as torch does), and multiplies the
    gradient by ``inv_scale`` in place, in float32 at least."""
    xp = grad.device.array_module()
    array = grad.array
    with grad.device.context():
        nonfinite = ~xp.isfinite(array).all()
        if inv_scale != 1.0:
            with np.errstate(over="ignore", invalid="ignore"):
                xp.multiply(array, inv_scale, out=array, dtype=_compute_dtype(array.dtype), casting="unsafe")
            grad._version[0] += 1
    return nonfinite


def updated_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """torch's ``_amp_update_scale_`` on host values; returns the new (scale, growth_tracker).

    A step with inf/nan gradients multiplies the scale by ``backoff_factor`` and resets the tracker. A clean step
    counts; the ``growth_interval``-th clean step in a row multiplies the scale by ``growth_factor`` (unless that
    overflows float32) and resets the tracker. Products are taken in float64 and rounded to float32."""
    if found_inf:
        return _float32(scale * backoff_factor), 0
    successful = growth_tracker + 1
    if successful != growth_interval:
        return scale, successful
    with np.errstate(over="ignore"):
        grown = _float32(scale * growth_factor)
    return (grown if np.isfinite(grown) else scale), 0


class GradScaler:
    """Dynamic loss scaling: ``scale`` the loss, ``step`` the optimizer (skipped when a gradient is inf/nan),
    ``update`` the scale. Arguments and behaviour follow torch.amp.GradScaler.

    Args:
        device: "cpu" or "cuda": the device type a Tensor passed to ``update(new_scale)`` must be on. "cuda"
            without cupy and a GPU disables the scaler with a warning, as torch does.
        init_scale: the first scale factor.
        growth_factor: multiplies the scale after ``growth_interval`` clean steps in a row (must be > 1).
        backoff_factor: multiplies the scale after a step with inf/nan gradients (must be < 1).
        growth_interval: the number of clean steps in a row before the scale grows.
        enabled: False makes every method a pass-through (``step`` just calls ``optimizer.step``).
        process_group: the group whose ranks must agree on skipping a step (default: the world, once
            infini_train.distributed is initialized); in a group of one nothing is communicated.

    Unlike torch, float16 gradients are unscaled (in float32 arithmetic) instead of raising "Attempting to
    unscale FP16 gradients": this runtime trains float16 parameters directly.
    """

    def __init__(self, device="cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, process_group=None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"GradScaler: expected device 'cpu' or 'cuda', got {device!r}\n"
                             "HINT: pass the device type of the model's parameters")
        self._device = device
        self._enabled = bool(enabled)
        if device == "cuda" and self._enabled and not backend.cuda_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available.  Disabling.", stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise AssertionError(f"GradScaler: the growth factor must be > 1.0, got {growth_factor}\n"
                                     "HINT: the default growth_factor=2.0 doubles the scale")
            if backoff_factor >= 1.0:
                raise AssertionError(f"GradScaler: the backoff factor must be < 1.0, got {backoff_factor}\n"
                                     "HINT: the default backoff_factor=0.5 halves the scale")
        self._init_scale = init_scale
        self._init_growth_tracker = 0
        self._scale = None  # float32 value as a float; set by the first scale(), as torch does
        self._growth_tracker = None
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._process_group = process_group
        self._per_optimizer_states = {}  # id(optimizer) -> its stage and found-inf flags this iteration

    # --------------------------------------------------------------------------------- the iteration
    def scale(self, outputs):
        """``outputs`` (a Tensor, or nested lists/tuples of Tensors) multiplied by the current scale, with
        the same nesting; returned unchanged when the scaler is disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return _MulByScale(self._current_scale()).apply(outputs)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError(f"GradScaler.scale: outputs must be a Tensor or (nested) lists/tuples of Tensors, got "
                         f"{type(outputs).__name__}\nHINT: scale the loss Tensor: scaler.scale(loss).backward()")

    def expect_scaled_gradients(self):
        """Start this iteration on a rank whose gradients arrive already scaled from another rank's ``scale`` (a
        pipeline stage without the loss gets the gradient of the scaled loss from the next stage): fixes the
        iteration's scale as ``scale`` would, so that ``unscale_``, ``step`` and ``update`` work here. Every rank
        keeps the same scale, because they all start from the same one and skip (and back off) together."""
        if self._enabled:
            self._current_scale()

    @no_grad()
    def unscale_(self, optimizer):
        """Divide the gradients of ``optimizer``'s parameters by the scale, in place, and record whether any is
        inf or nan. Optional before ``step`` (which unscales otherwise); call it at most once per optimizer
        between ``update`` calls, e.g. to clip the true gradients before stepping."""
        if not self._enabled:
            return
        self._check_scale("unscale_")
        state = self._state_of(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().\n"
                               "HINT: unscale_ each optimizer once per iteration, after all its gradients are "
                               "accumulated")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().\nHINT: call scaler.update() to end the "
                               "iteration before unscaling the next one's gradients")
        inv_scale = _float32(1.0 / self._scale)
        found = {}  # device -> 0-d bool array: some gradient on that device is inf/nan
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    flag = _check_and_unscale_(p.grad, inv_scale)
                    dev = p.grad.device
                    found[dev] = flag if dev not in found else found[dev] | flag
        state["found_inf_per_device"] = found
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscale ``optimizer``'s gradients (unless ``unscale_`` did) and call ``optimizer.step(*args,
        **kwargs)`` unless a gradient was inf/nan (on any rank of the process group). Returns what
        ``optimizer.step`` returned, or None when the step was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.\n"
                               "HINT: compute the loss and backward the scaled loss before scaler.step(optimizer)")
        self._check_scale("step")
        state = self._state_of(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().\n"
                               "HINT: call scaler.update() once per iteration, after stepping every optimizer")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise AssertionError("No inf checks were recorded for this optimizer.\nHINT: none of its parameters "
                                 "has a .grad; backward the scaled loss before scaler.step(optimizer)")
        result = None
        if not self._found_inf(state):
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale=None):
        """End the iteration: set the scale to ``new_scale`` (a float, or a one-element Tensor on the scaler's
        device type that does not require grad) if given, else back off when any optimizer saw inf/nan
        gradients this iteration and grow after ``growth_interval`` clean iterations in a row."""
        if not self._enabled:
            return
        self._check_scale("update")
        if new_scale is not None:
            self._scale = self._checked_new_scale(new_scale)
        else:
            flags = [self._found_inf(s) for s in self._per_optimizer_states.values() if s["found_inf_per_device"]]
            if not flags:
                raise AssertionError("No inf checks were recorded prior to update.\nHINT: call scaler.step(optimizer)"
                                     " (or scaler.unscale_(optimizer)) before scaler.update()")
            self._scale, self._growth_tracker = updated_scale(
                self._scale, self._growth_tracker, sum(flags), self._growth_factor, self._backoff_factor,
                self._growth_interval)
        self._per_optimizer_states = {}

    # --------------------------------------------------------------------------------- accessors
    def get_scale(self):
        """The current scale as a float (the initial scale before the first ``scale``; 1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        self._growth_factor = new_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        self._backoff_factor = new_factor

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        self._growth_interval = new_interval

    def is_enabled(self):
        return self._enabled

    def _get_growth_tracker(self):
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else self._growth_tracker

    def state_dict(self):
        """torch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker (an empty dict
        when disabled). Take it after ``update`` to checkpoint a whole iteration."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict):
        """Restore what ``state_dict`` returned (a no-op when this scaler is disabled)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled "
                               "instance of GradScaler.\nHINT: load a state_dict saved from an enabled scaler, "
                               "or build this one with enabled=False")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale = _float32(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker = int(state_dict["_growth_tracker"])

    # --------------------------------------------------------------------------------- internals
    def _current_scale(self):
        if self._scale is None:
            self._scale = _float32(self._init_scale)
            self._growth_tracker = int(self._init_growth_tracker)
        return self._scale

    def _check_scale(self, method):
        if self._scale is None:
            raise AssertionError(f"Attempted {method} but _scale is None.  This may indicate your script did not "
                                 f"use scaler.scale(loss or outputs) earlier in the iteration.\n{_NO_SCALE_HINT}")

    def _state_of(self, optimizer):
        return self._per_optimizer_states.setdefault(
            id(optimizer), {"stage": _READY, "found_inf_per_device": {}, "found_inf": None})

    def _found_inf(self, state):
        """1.0 when a gradient of this optimizer was inf/nan on any rank of the group, else 0.0; computed once
        per iteration (one device sync, and one all-reduce in a group of more than one rank)."""
        if state["found_inf"] is None:
            found_per_device = state["found_inf_per_device"]
            first = next(iter(found_per_device))
            xp = first.array_module()
            with first.context():
                flag = xp.zeros(1, backend.float32)
                for found in found_per_device.values():
                    flag += backend.to_device_array(found, first)
                group = self._sync_group()
                if group is not None:
                    group.all_reduce(flag, dist.ReduceOp.MAX)
                state["found_inf"] = float(flag[0] > 0)
        return state["found_inf"]

    def _sync_group(self):
        """The process group whose ranks must agree on skipping, or None where this process is alone."""
        group = self._process_group
        if group is None:
            if not dist.is_initialized():
                return None
            group = dist.default_group()
        return group if group.size > 1 else None

    def _checked_new_scale(self, new_scale):
        if isinstance(new_scale, float):
            return _float32(new_scale)
        expected = ("new_scale should be a float or a 1-element Tensor on the scaler's device type "
                    f"({self._device!r}) with requires_grad=False")
        if not isinstance(new_scale, Tensor):
            raise TypeError(f"GradScaler.update: {expected}, got {type(new_scale).__name__} {new_scale!r}\n"
                            "HINT: pass float(value)")
        if new_scale.device.type != self._device or new_scale.numel() != 1 or new_scale.requires_grad:
            raise AssertionError(f"GradScaler.update: {expected}, got a Tensor of shape {tuple(new_scale.shape)} on "
                                 f"{new_scale.device} with requires_grad={new_scale.requires_grad}\n"
                                 "HINT: pass new_scale.detach() (or a float)")
        return _float32(new_scale.item())
