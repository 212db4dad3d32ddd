"""How ops report bad input (OpError: the op, what was expected, what was received, a hint) and silence numpy's
floating-point warnings where they handle inf and nan themselves."""
from __future__ import annotations

from ..backend import host_errstate


class OpError(ValueError):
    """A bad input to an op: names the op, what was expected, what was received, and a hint."""


def op_error(op, expected, received, hint=None) -> OpError:
    msg = f"{op}: expected {expected}, got {received}"
    if hint:
        msg += f"\nHINT: {hint}"
    return OpError(msg)


class ignore_fp_errors:
    """Silence numpy's divide/invalid warnings where an op handles inf/nan itself (cupy has no errstate)."""

    def __init__(self, xp):
        self.ctx = host_errstate(xp, divide="ignore", invalid="ignore")

    def __enter__(self):
        self.ctx.__enter__()

    def __exit__(self, *exc):
        self.ctx.__exit__(*exc)
        return False


__all__ = ["OpError", "op_error", "ignore_fp_errors"]
