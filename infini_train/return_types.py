"""Named tuples returned by ops with two results, as ``torch.return_types``: ``v, i = x.max(dim=1)`` unpacks,
and ``x.max(dim=1).values`` / ``.indices`` name the parts."""
from __future__ import annotations

from collections import namedtuple

max = namedtuple("max", ["values", "indices"])  # noqa: A001 - torch.return_types.max
min = namedtuple("min", ["values", "indices"])  # noqa: A001 - torch.return_types.min
sort = namedtuple("sort", ["values", "indices"])
topk = namedtuple("topk", ["values", "indices"])

__all__ = ["max", "min", "sort", "topk"]
