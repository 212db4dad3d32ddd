import pytest

from infini_train.distributed.mesh import MeshError, ProcessMesh


def test_a_mesh_larger_than_a_world_of_one_names_the_sizes():
    with pytest.raises(MeshError, match=r"^parallel: the world of 1 rank is not divisible by tensor = 2\nHINT: start "
                                        r"a multiple of 2 ranks \(mpirun -n 2\), or change parallel.tensor$"):
        ProcessMesh(tensor=2)


def test_the_mesh_arithmetic_is_designs_rank_layout_without_a_process_group():
    from infini_train.distributed.mesh import mesh_coordinates, mesh_groups, mesh_rank

    sizes = dict(tensor=2, data=2, context=1)  # world 8 = PP2 x DP2 x TP2
    assert [mesh_coordinates(r, **sizes) for r in (0, 1, 2, 5, 7)] == [
        {"tp": 0, "cp": 0, "dp": 0, "pp": 0}, {"tp": 1, "cp": 0, "dp": 0, "pp": 0},
        {"tp": 0, "cp": 0, "dp": 1, "pp": 0}, {"tp": 1, "cp": 0, "dp": 0, "pp": 1},
        {"tp": 1, "cp": 0, "dp": 1, "pp": 1}]
    assert all(mesh_rank(**mesh_coordinates(r, **sizes), **sizes) == r for r in range(8))
    groups = {}
    for kind, ranks in mesh_groups(pipeline=2, **sizes):
        groups.setdefault(kind, []).append(ranks)
    assert groups == {"tensor": [[0, 1], [2, 3], [4, 5], [6, 7]], "data": [[0, 2], [1, 3], [4, 6], [5, 7]],
                      "pipeline": [[0, 4], [1, 5], [2, 6], [3, 7]], "embedding": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    with_context = {kind for kind, _ in mesh_groups(tensor=2, data=2, pipeline=1, context=2)}
    assert with_context == {"tensor", "context", "data", "grad", "pipeline"}


def test_hybrid_context_groups_tile_each_context_group():
    from infini_train.distributed.mesh import mesh_groups

    groups = {}
    for kind, ranks in mesh_groups(tensor=2, data=1, pipeline=1, context=4, context_a2a=2):  # world 8 = CP4 x TP2
        groups.setdefault(kind, []).append(ranks)
    assert groups["context"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert groups["context_a2a"] == [[0, 2], [4, 6], [1, 3], [5, 7]]  # consecutive context ranks
    assert groups["context_ring"] == [[0, 4], [2, 6], [1, 5], [3, 7]]  # the same place in each all-to-all group
    assert "context_a2a" not in {kind for kind, _ in mesh_groups(tensor=1, data=1, pipeline=1, context=4)}
    with pytest.raises(MeshError, match="parallel.context_a2a: expected a divisor of parallel.context"):
        ProcessMesh(context=4, context_a2a=3)
