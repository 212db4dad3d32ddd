"""The process mesh of a parallel run: world = PP x DP x CP x TP ranks, laid out tensor-fastest, then context,
then data, then pipeline (as Megatron-LM does):

    rank = ((pp_rank * DP + dp_rank) * CP + cp_rank) * TP + tp_rank

so the ranks 0..TP-1 form the first tensor-parallel group and a tensor group never spans nodes before a context or
data group does. The data-parallel size is derived: DP = world / (TP x CP x PP). The context ranks of a data-parallel
rank read the same batches (each keeps its chunks of every sequence), and gradients are averaged over the data x
context group (``grad_group``), as Megatron-LM's data-parallel-with-context group. Each rank belongs to one group
of each kind, made once with ``new_group`` (every rank walks every group in the same order, members join theirs).
With pipeline stages, the ``embedding_group`` of a rank on the first or last stage holds both (Megatron-LM's
embedding group). Hybrid context parallelism (``context_a2a`` = A, 1 < A < CP) splits each context group into
``context_a2a`` groups of A consecutive context ranks (the all-to-all) and ``context_ring`` groups of the ranks at the
same place in each (the ring across them).
"""
from __future__ import annotations


class MeshError(ValueError):
    """A mesh that does not fit the world: names the sizes and gives a hint."""


def mesh_rank(tp, dp, pp, cp=0, *, tensor, data, context=1):
    """The world rank at mesh coordinates (tp, dp, pp, cp) of a mesh of ``tensor`` x ``context`` x ``data`` x any
    pipeline ranks: tensor fastest, then context, data, pipeline."""
    return ((pp * data + dp) * context + cp) * tensor + tp


def mesh_coordinates(rank, *, tensor, data, context=1):
    """``rank``'s mesh coordinates as a dict {"tp", "cp", "dp", "pp"} (``mesh_rank``'s inverse)."""
    return {"tp": rank % tensor, "cp": (rank // tensor) % context, "dp": (rank // (tensor * context)) % data,
            "pp": rank // (tensor * context * data)}


def mesh_groups(*, tensor, data, pipeline, context=1, context_a2a=1):
    """Every group of the mesh as (kind, ranks), kind one of "tensor", "context" (context > 1), "context_a2a" and
    "context_ring" (1 < context_a2a < context: hybrid context parallelism), "data", "grad" (data x context, context >
    1), "pipeline" and "embedding" (the first and last stage, pipeline > 1), in the order every rank makes them.
    Pure: no process group is needed (the docs draw their rank layouts from it)."""
    tp, dp, pp, cp, a2a = tensor, data, pipeline, context, context_a2a

    def at(t, d, p, c):
        return mesh_rank(t, d, p, c, tensor=tp, data=dp, context=cp)

    out = [("tensor", [at(t, d, p, c) for t in range(tp)]) for p in range(pp) for d in range(dp) for c in range(cp)]
    if cp > 1:
        contexts = [[at(t, d, p, c) for c in range(cp)] for p in range(pp) for d in range(dp) for t in range(tp)]
        out += [("context", members) for members in contexts]
        if 1 < a2a < cp:
            out += [("context_a2a", members[g * a2a:(g + 1) * a2a]) for members in contexts for g in range(cp // a2a)]
            out += [("context_ring", members[i::a2a]) for members in contexts for i in range(a2a)]
    out += [("data", [at(t, d, p, c) for d in range(dp)]) for p in range(pp) for c in range(cp) for t in range(tp)]
    if cp > 1:
        out += [("grad", [at(t, d, p, c) for d in range(dp) for c in range(cp)]) for p in range(pp) for t in range(tp)]
    out += [("pipeline", [at(t, d, p, c) for p in range(pp)]) for d in range(dp) for c in range(cp) for t in range(tp)]
    if pp > 1:  # the first and last stage: the tied embedding / output weight lives on both
        out += [("embedding", [at(t, d, 0, c), at(t, d, pp - 1, c)])
                for d in range(dp) for c in range(cp) for t in range(tp)]
    return out


class ProcessMesh:
    """``ProcessMesh(tensor=1, pipeline=1, context=1, context_a2a=1)``: this rank's coordinates and its tensor /
    context / data / pipeline groups, the data x context group gradients are averaged over (``grad_group``: the data
    group without context parallelism), on the first and last stage its embedding group and, with 1 < context_a2a <
    context, its hybrid context groups (``context_a2a_group``, ``context_ring_group``; None otherwise)."""

    def __init__(self, tensor=1, pipeline=1, context=1, context_a2a=1):
        from . import get_rank, get_world_size, new_group

        world, rank = get_world_size(), get_rank()
        for name, size in (("tensor", tensor), ("pipeline", pipeline), ("context", context),
                           ("context_a2a", context_a2a)):
            if not isinstance(size, int) or size < 1:
                raise MeshError(f"parallel.{name}: expected an integer >= 1, got {size!r}")
        if context % context_a2a:
            raise MeshError(f"parallel.context_a2a: expected a divisor of parallel.context ({context}), got "
                            f"{context_a2a}\nHINT: all-to-all groups of context_a2a consecutive context ranks tile "
                            "the context group")
        split = tensor * pipeline * context
        if world % split:
            named = [(k, v) for k, v in (("tensor", tensor), ("context", context), ("pipeline", pipeline))
                     if v > 1 or k == "tensor"]
            sizes = (" x ".join(k for k, _ in named) + " = " + " x ".join(str(v) for _, v in named) + f" = {split}"
                     if len(named) > 1 else f"tensor = {tensor}")
            keys = " / ".join(f"parallel.{k}" for k, _ in named)
            ranks = "1 rank" if world == 1 else f"{world} ranks"
            raise MeshError(
                f"parallel: the world of {ranks} is not divisible by {sizes}\nHINT: start a multiple of "
                f"{split} ranks (mpirun -n {split * max(1, world // split)}), or change {keys}")
        self.world = world
        self.tp_size, self.pp_size, self.cp_size, self.cp_a2a = tensor, pipeline, context, context_a2a
        self.dp_size = world // split
        at = mesh_coordinates(rank, tensor=tensor, data=self.dp_size, context=context)
        self.tp_rank, self.cp_rank, self.dp_rank, self.pp_rank = at["tp"], at["cp"], at["dp"], at["pp"]
        self.tensor_group = self.context_group = self.data_group = self.pipeline_group = None
        self.embedding_group = self.grad_group = self.context_a2a_group = self.context_ring_group = None
        for kind, members in self._all_groups():
            group = new_group(members)
            if rank in members:
                setattr(self, f"{kind}_group", group)
        if context == 1:
            self.grad_group = self.data_group

    def rank_of(self, tp, dp, pp, cp=0):
        """The world rank at mesh coordinates (tp, dp, pp, cp): tensor fastest, then context, data, pipeline."""
        return mesh_rank(tp, dp, pp, cp, tensor=self.tp_size, data=self.dp_size, context=self.cp_size)

    def _all_groups(self):
        return mesh_groups(tensor=self.tp_size, data=self.dp_size, pipeline=self.pp_size, context=self.cp_size,
                           context_a2a=self.cp_a2a)

    def __repr__(self):
        return (f"ProcessMesh(world {self.world} = pipeline {self.pp_size} x data {self.dp_size} x context "
                f"{self.cp_size} x tensor {self.tp_size}; this rank: pp {self.pp_rank}, dp {self.dp_rank}, cp "
                f"{self.cp_rank}, tp {self.tp_rank})")


__all__ = ["ProcessMesh", "MeshError", "mesh_rank", "mesh_coordinates", "mesh_groups"]
