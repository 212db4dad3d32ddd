"""``it.linalg``: the vector norm of torch.linalg (matrix factorizations are not provided)."""
from __future__ import annotations

from .autograd.ops.statistics import vector_norm

__all__ = ["vector_norm"]
