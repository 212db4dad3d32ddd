import pytest

from infini_train.distributed.mesh import MeshError, ProcessMesh


def test_a_mesh_larger_than_a_world_of_one_names_the_sizes():
    with pytest.raises(MeshError, match=r"^parallel: the world of 1 rank is not divisible by tensor = 2\nHINT: start "
                                        r"a multiple of 2 ranks \(mpirun -n 2\), or change parallel.tensor$"):
        ProcessMesh(tensor=2)
