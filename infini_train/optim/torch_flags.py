"""The implementation flags torch 2.13's optimizers keep in every param group (``foreach``, ``capturable``,
``differentiable``, ``fused``), so a state dict has torch's keys and loads either way: torch's state dicts into ours,
ours into torch's optimizers. Here they choose nothing: every update is the one in-place single-tensor pass (fused on
GPUs where a kernel exists), whatever ``foreach`` / ``fused`` say; ``capturable`` is kept as given (our steps are
host ints, so graph capture does not arise). ``differentiable=True`` (autograd through the step) is refused."""
from __future__ import annotations

SGD_FLAGS = ("foreach", "differentiable", "fused")  # after ``maximize``, in torch's order
ADAM_FLAGS = ("foreach", "capturable", "differentiable", "fused")  # after ``maximize``, before decoupled_weight_decay


def flags(name, names, foreach=None, capturable=False, differentiable=False, fused=None):
    """{flag: value} for ``names``, as torch's defaults (None, False, False, None), checked."""
    for key, value in (("foreach", foreach), ("fused", fused)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"{name}: expected {key}=None, True or False, got {value!r}")
    if differentiable:
        raise NotImplementedError(f"{name}: differentiable=True (autograd through the optimizer step) is not "
                                  "supported\nHINT: leave differentiable=False; steps run in place under no_grad")
    given = dict(foreach=foreach, capturable=bool(capturable), differentiable=False, fused=fused)
    return {k: given[k] for k in names}


__all__ = ["SGD_FLAGS", "ADAM_FLAGS", "flags"]
