"""The 2-D data-parallel mesh of hybrid sharded data parallelism (HSDP; FSDP2's ("replicate", "shard") DeviceMesh,
DeepSpeed ZeRO++'s hpZ): the data-parallel ranks form ``replicate`` replicas of ``shard`` consecutive ranks each.
``fully_shard(module, mesh)`` shards the parameters, gradients and optimizer state over a replica's ranks (a node:
the all-gathers and reduce-scatters stay inside it) and keeps the same shards on every replica; after a unit's
reduce-scatter its gradient shard is all-reduced over the replicate group (the ranks holding the same shard), the
only traffic that crosses replicas.

    mesh = HybridShardMesh.build(replicate=2)           # over the world: ranks 0-1 and 2-3 are the replicas
    for block in model.transformer.h:
        fully_shard(block, mesh)
    fully_shard(model, mesh)
"""
from __future__ import annotations


class HybridShardMesh:
    """``HybridShardMesh(replicate_group, shard_group)``: this rank's two groups (either may have one rank)."""

    def __init__(self, replicate_group, shard_group):
        self.replicate_group, self.shard_group = replicate_group, shard_group

    @property
    def replicate(self):
        return self.replicate_group.size

    @property
    def shard(self):
        return self.shard_group.size

    @classmethod
    def build(cls, replicate, data_groups=None):
        """The mesh of this rank, splitting each data-parallel group (``data_groups``: every one of the world, as
        lists of world ranks in data-parallel order, the same list on every rank; default: the world) into
        ``replicate`` replicas of consecutive ranks. Collective: every rank of the world calls it alike."""
        from .. import get_rank, get_world_size, new_group

        if data_groups is None:
            data_groups = [list(range(get_world_size()))]
        replicate = int(replicate)
        rank, mine = get_rank(), None
        for ranks in data_groups:
            if replicate < 1 or len(ranks) % replicate:
                raise ValueError(f"parallel.data_replicate: expected a divisor of the data-parallel size "
                                 f"({len(ranks)}), got {replicate}\nHINT: data parallel = data_replicate x shard "
                                 f"size; choose data_replicate among {_divisors(len(ranks))}")
            shard = len(ranks) // replicate
            shards = [new_group(ranks[k * shard:(k + 1) * shard]) for k in range(replicate)]
            replicas = [new_group(ranks[j::shard]) for j in range(shard)]
            if rank in ranks:
                mine = cls(next(g for g in replicas if g is not None), next(g for g in shards if g is not None))
        if mine is None:
            raise ValueError(f"HybridShardMesh.build: rank {rank} is in none of the data groups {data_groups}")
        return mine

    def __repr__(self):
        return (f"HybridShardMesh(replicate {self.replicate} x shard {self.shard}: replicate group "
                f"{self.replicate_group.ranks}, shard group {self.shard_group.ranks})")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


__all__ = ["HybridShardMesh"]
