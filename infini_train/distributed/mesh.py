"""The process mesh of a parallel run: world = PP x DP x TP ranks, laid out tensor-fastest, then data, then
pipeline (as Megatron-LM does):

    rank = pp_rank * (DP * TP) + dp_rank * TP + tp_rank

so the ranks 0..TP-1 form the first tensor-parallel group and a tensor group never spans nodes before a data
group does. The data-parallel size is derived: DP = world / (TP x PP). Each rank belongs to one group of each kind,
made once with ``new_group`` (every rank walks every group in the same order, members join theirs). With pipeline
stages, the ``embedding_group`` of a rank on the first or last stage holds both (Megatron-LM's embedding group).
"""
from __future__ import annotations


class MeshError(ValueError):
    """A mesh that does not fit the world: names the sizes and gives a hint."""


class ProcessMesh:
    """``ProcessMesh(tensor=1, pipeline=1)``: this rank's coordinates and its tensor / data / pipeline groups (and,
    on the first and last stage, its embedding group)."""

    def __init__(self, tensor=1, pipeline=1):
        from . import get_rank, get_world_size, new_group

        world, rank = get_world_size(), get_rank()
        for name, size in (("tensor", tensor), ("pipeline", pipeline)):
            if not isinstance(size, int) or size < 1:
                raise MeshError(f"parallel.{name}: expected an integer >= 1, got {size!r}")
        if world % (tensor * pipeline):
            sizes = f"tensor x pipeline = {tensor} x {pipeline} = {tensor * pipeline}" if pipeline > 1 \
                else f"tensor = {tensor}"
            keys = "parallel.tensor / parallel.pipeline" if pipeline > 1 else "parallel.tensor"
            raise MeshError(
                f"parallel: the world of {world} ranks is not divisible by {sizes}\nHINT: start a multiple of "
                f"{tensor * pipeline} ranks (mpirun -n {tensor * pipeline * max(1, world // (tensor * pipeline))}), "
                f"or change {keys}")
        self.world = world
        self.tp_size, self.pp_size = tensor, pipeline
        self.dp_size = world // (tensor * pipeline)
        self.tp_rank = rank % tensor
        self.dp_rank = (rank // tensor) % self.dp_size
        self.pp_rank = rank // (tensor * self.dp_size)
        self.tensor_group = self.data_group = self.pipeline_group = self.embedding_group = None
        for kind, members in self._all_groups():
            group = new_group(members)
            if rank in members:
                setattr(self, f"{kind}_group", group)

    def rank_of(self, tp, dp, pp):
        """The world rank at mesh coordinates (tp, dp, pp)."""
        return pp * (self.dp_size * self.tp_size) + dp * self.tp_size + tp

    def _all_groups(self):
        tp, dp, pp = self.tp_size, self.dp_size, self.pp_size
        for p in range(pp):
            for d in range(dp):
                yield "tensor", [self.rank_of(t, d, p) for t in range(tp)]
        for p in range(pp):
            for t in range(tp):
                yield "data", [self.rank_of(t, d, p) for d in range(dp)]
        for d in range(dp):
            for t in range(tp):
                yield "pipeline", [self.rank_of(t, d, p) for p in range(pp)]
        if pp > 1:  # the first and last stage: the tied embedding / output weight lives on both
            for d in range(dp):
                for t in range(tp):
                    yield "embedding", [self.rank_of(t, d, 0), self.rank_of(t, d, pp - 1)]

    def __repr__(self):
        return (f"ProcessMesh(world {self.world} = pipeline {self.pp_size} x data {self.dp_size} x tensor "
                f"{self.tp_size}; this rank: pp {self.pp_rank}, dp {self.dp_rank}, tp {self.tp_rank})")


__all__ = ["ProcessMesh", "MeshError"]
