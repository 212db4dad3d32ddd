"""The expert-parallel groups of a run (DESIGN.md's contract): expert parallelism of size E splits the data x
context ranks that share (pp, tp) into groups of E consecutive ranks (the ``expert`` groups, over which tokens are
exchanged); the ranks at the same place in every expert group hold the same experts and form an ``expert_data``
group, over which the expert weights are data-parallel. With DP x CP = 4 and E = 2 (ranks 0..3):

    expert groups       [0, 1], [2, 3]       rank 0 and 2 keep experts [0, n/2), ranks 1 and 3 keep [n/2, n)
    expert-data groups  [0, 2], [1, 3]

``expert_layout`` lists them (pure: no communication); ``expert_groups`` makes them with ``new_group`` (every rank
walks every group in the same order, members join theirs) and returns this rank's.
"""
from __future__ import annotations

from typing import NamedTuple

from .mesh import MeshError, ProcessMesh


class ExpertGroups(NamedTuple):
    expert_group: object       # this rank's E consecutive ranks (tokens exchanged; experts split over it)
    expert_data_group: object  # the ranks holding the same experts (their gradients reduced over it)
    expert_size: int           # E
    expert_rank: int           # this rank's place in its expert group: it keeps experts [r * n / E, (r + 1) * n / E)
    data_size: int             # the data (x context) ranks that share (pp, tp): E x the expert-data size


def _rank_lists(dp_ranks_or_mesh):
    """Every list of data x context ranks that share (pp, tp), in rank order."""
    if isinstance(dp_ranks_or_mesh, ProcessMesh):
        m = dp_ranks_or_mesh
        return [[m.rank_of(t, d, p, c) for d in range(m.dp_size) for c in range(m.cp_size)]
                for p in range(m.pp_size) for t in range(m.tp_size)]
    lists = [list(r) for r in dp_ranks_or_mesh] if all(hasattr(r, "__iter__") for r in dp_ranks_or_mesh) else None
    return lists if lists else [[int(r) for r in dp_ranks_or_mesh]]


def expert_layout(dp_ranks_or_mesh, expert):
    """[(kind, ranks)] for kind "expert" and "expert_data": ``dp_ranks_or_mesh`` is a ProcessMesh, one list of data
    ranks, or every such list (one per (pp, tp))."""
    if not isinstance(expert, int) or expert < 1:
        raise MeshError(f"parallel.expert: expected an integer >= 1, got {expert!r}")
    lists = _rank_lists(dp_ranks_or_mesh)
    for ranks in lists:
        if len(ranks) % expert:
            raise MeshError(f"parallel.expert: the {len(ranks)} data x context ranks {ranks} are not divisible by "
                            f"expert = {expert}\nHINT: choose parallel.expert among the divisors of {len(ranks)}")
    out = []
    for ranks in lists:
        out += [("expert", ranks[g:g + expert]) for g in range(0, len(ranks), expert)]
    for ranks in lists:
        out += [("expert_data", ranks[i::expert]) for i in range(expert)]
    return out


def expert_groups(dp_ranks_or_mesh, expert):
    """This rank's ``ExpertGroups`` (made with ``new_group``; every rank of the world calls it with the same
    arguments). A rank outside every list gets groups of None."""
    from . import get_rank, new_group

    rank = get_rank()
    found = {"expert": None, "expert_data": None}
    for kind, members in expert_layout(dp_ranks_or_mesh, expert):
        group = new_group(members)
        if rank in members:
            found[kind] = group
    data_size = next((len(r) for r in _rank_lists(dp_ranks_or_mesh) if rank in r), 0)
    eg = found["expert"]
    return ExpertGroups(eg, found["expert_data"], expert, eg.rank if eg is not None else 0, data_size)


__all__ = ["ExpertGroups", "expert_groups", "expert_layout"]
