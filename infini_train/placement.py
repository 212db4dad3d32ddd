"""Where a parameter's values live across ranks: one typed record per tensor (what DTensor calls its placements),
read by nn/, optim/, autocast, ZeRO, fully_shard and checkpoints instead of probing attributes.

    p.placement.tensor_shard       a ShardSpec: split over the tensor-parallel group (None: whole on every tensor rank)
    p.placement.sequence_parallel  its gradient is partial per sequence slice: summed over the tensor group
    p.placement.expert_local       an expert this rank alone holds within its expert group (norms count it once)
    p.placement.tied_copy          the last pipeline stage's copy of a tied embedding: its gradient is summed with the
                                   embedding's over the embedding group, and norms leave it out
    p.placement.flat_shard         fully_shard's flat space holding this rank's shard of it (None: the values are here)
    p.placement.routed             reached only by the tokens routed to it (a mixture of experts' expert): a rank may
                                   get no gradient for it in a step, so no collective may wait for its gradient

Every tensor reads REPLICATED until ``place(t, ...)`` gives it a record of its own (records are immutable; a
Parameter keeps its own, a plain tensor is always replicated).
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    tensor_shard: Any = None
    sequence_parallel: bool = False
    expert_local: bool = False
    tied_copy: bool = False
    flat_shard: Any = None
    routed: bool = False

    @property
    def replicated(self):
        """Whole on every rank of the tensor group (not split along a dimension)."""
        return self.tensor_shard is None


REPLICATED = Placement()


def place(tensor, **changes):
    """Give ``tensor`` (a Parameter) its placement with ``changes`` (Placement's fields); returns it."""
    tensor.placement = dataclasses.replace(tensor.placement, **changes)
    return tensor


__all__ = ["Placement", "REPLICATED", "place"]
