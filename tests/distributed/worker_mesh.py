"""Under ``mpiexec -n 4``: ProcessMesh at tensor sizes 1, 2 and 4 puts ranks tensor-fastest (rank = dp * TP + tp),
and each group it makes holds exactly the ranks of its row or column (checked by all-gathering world ranks over
it); a tensor size that does not divide the world is refused naming both numbers."""
import numpy as np

from infini_train import distributed as dist
from infini_train.distributed.mesh import MeshError, ProcessMesh
from infini_train.tensor import Tensor

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4


def members(group):
    parts = [Tensor(np.zeros(1, np.int64)) for _ in range(group.size)]
    dist.all_gather(parts, Tensor(np.array([rank], np.int64)), group=group)
    return [int(p.numpy()[0]) for p in parts]


for tensor in (1, 2, 4):
    mesh = ProcessMesh(tensor=tensor)
    dp = world // tensor
    assert (mesh.tp_size, mesh.dp_size, mesh.pp_size) == (tensor, dp, 1), mesh
    assert (mesh.tp_rank, mesh.dp_rank, mesh.pp_rank) == (rank % tensor, rank // tensor, 0), mesh
    assert mesh.rank_of(mesh.tp_rank, mesh.dp_rank, 0) == rank
    first = rank - rank % tensor
    assert members(mesh.tensor_group) == list(range(first, first + tensor)), (tensor, members(mesh.tensor_group))
    assert members(mesh.data_group) == list(range(rank % tensor, world, tensor)), (tensor, members(mesh.data_group))
    assert members(mesh.pipeline_group) == [rank]
    assert mesh.tensor_group.rank == mesh.tp_rank and mesh.data_group.rank == mesh.dp_rank

try:
    ProcessMesh(tensor=3)
    raise AssertionError("tensor=3 on 4 ranks was accepted")
except MeshError as exc:
    assert "world of 4 ranks is not divisible by tensor = 3" in str(exc) and "HINT" in str(exc), exc

print(f"rank {rank}: mesh ok", flush=True)
dist.destroy_process_group()
