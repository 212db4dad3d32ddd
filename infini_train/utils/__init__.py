"""Utilities as torch.utils names them: ``utils.checkpoint`` (activation recomputation)."""
from . import checkpoint

__all__ = ["checkpoint"]
