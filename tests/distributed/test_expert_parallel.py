"""Expert parallelism of it.nn.MoE (nn/parallel/expert_parallel.py) and its groups (distributed/expert_groups.py):
real MPI jobs at EP2, EP4 and EP2 x 2 expert groups against the one-process layer (worker_expert_parallel.py), and
in process: the group layout, the refusals, the local experts' names and a world of one."""
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it
from infini_train.distributed.expert_groups import expert_layout
from infini_train.distributed.mesh import MeshError, ProcessMesh
from infini_train.distributed.process_group import SingleProcessGroup
from infini_train.nn.parallel import expert_parallel, expert_parameters, shard_expert_state_dict
from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec, output

pytestmark = pytest.mark.layouts


@needs_mpiexec
@pytest.mark.parametrize("ranks, sizes", [(2, ["2"]), (4, ["4", "2"])])
def test_expert_parallel_matches_one_process_moe(ranks, sizes):
    # outputs, input / expert / router / shared-expert gradients, metrics and bytes; an expert no token reaches, a
    # rank sending nothing to its peers, a rank without tokens, top_k = num_experts, top_k = 1, capacity with drops;
    # the refusal; the expert-data reduction; whole and sharded state dicts
    proc = mpirun(ranks, "worker_expert_parallel.py", *sizes, timeout=180)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "EP OK", ranks, at_least=150 * len(sizes) + 1)


def test_expert_layout_splits_the_data_ranks_into_consecutive_groups():
    assert expert_layout(range(4), 2) == [("expert", [0, 1]), ("expert", [2, 3]),
                                          ("expert_data", [0, 2]), ("expert_data", [1, 3])]
    assert expert_layout([0, 1, 2, 3], 4) == [("expert", [0, 1, 2, 3])] + [("expert_data", [r]) for r in range(4)]
    assert expert_layout([[0, 2], [1, 3]], 2) == [("expert", [0, 2]), ("expert", [1, 3]),
                                                  ("expert_data", [0]), ("expert_data", [2]),
                                                  ("expert_data", [1]), ("expert_data", [3])]
    with pytest.raises(MeshError, match=r"the 6 data x context ranks .* not divisible by expert = 4\nHINT"):
        expert_layout(range(6), 4)
    with pytest.raises(MeshError, match="expected an integer >= 1"):
        expert_layout(range(4), 0)


def test_expert_layout_of_a_mesh_takes_the_data_x_context_ranks_sharing_pp_and_tp():
    mesh = ProcessMesh.__new__(ProcessMesh)  # world 16 = pipeline 2 x data 2 x context 2 x tensor 2, no groups
    mesh.tp_size, mesh.cp_size, mesh.dp_size, mesh.pp_size = 2, 2, 2, 2
    layout = expert_layout(mesh, 2)
    experts = [r for kind, r in layout if kind == "expert"]
    assert experts[:4] == [[0, 2], [4, 6], [1, 3], [5, 7]] and experts[4:6] == [[8, 10], [12, 14]]
    data = [r for kind, r in layout if kind == "expert_data"]
    assert data[:2] == [[0, 4], [2, 6]] and len(data) == 8
    assert sorted(r for g in experts for r in g) == list(range(16))


def test_refusals():
    moe = it.nn.MoE(4, 3, 6, 2)
    with pytest.raises(ValueError, match=r"num_experts \(6\) must be divisible by the expert-parallel size \(4\)"):
        expert_parallel(moe, SimpleNamespace(size=4, rank=0))
    expert_parallel(moe, SimpleNamespace(size=3, rank=1))
    with pytest.raises(ValueError, match="already expert-parallel"):
        expert_parallel(moe, SimpleNamespace(size=3, rank=1))


def test_local_experts_keep_their_global_names():
    moe = expert_parallel(it.nn.MoE(4, 3, 6, 2, num_shared_experts=1), SimpleNamespace(size=3, rank=1))
    names = list(moe.state_dict())
    assert [n for n in names if n.startswith("experts.")] == [
        f"experts.{e}.{p}_proj.weight" for e in (2, 3) for p in ("gate", "up", "down")]
    assert "gate.weight" in names and "shared_expert.up_proj.weight" in names
    assert len(expert_parameters(moe)) == 6 and all(p.shape in ((3, 4), (4, 3)) for p in expert_parameters(moe))
    whole = it.nn.MoE(4, 3, 6, 2, num_shared_experts=1).state_dict()
    mine = shard_expert_state_dict(moe, whole)
    assert list(mine) == names
    moe.load_state_dict(mine, strict=True)


def test_world_of_one_is_the_plain_layer():
    it.manual_seed(3)
    ref = it.nn.MoE(6, 4, 4, 2, dtype=it.float64, capacity_factor=0.75)
    it.manual_seed(3)
    moe = expert_parallel(it.nn.MoE(6, 4, 4, 2, dtype=it.float64, capacity_factor=0.75), SingleProcessGroup())
    x = np.random.default_rng(0).standard_normal((2, 5, 6))
    xa, xb = it.tensor(x, requires_grad=True), it.tensor(x, requires_grad=True)
    ya, yb = ref(xa), moe(xb)
    np.testing.assert_allclose(yb.numpy(), ya.numpy(), rtol=1e-12)
    (ya ** 2).sum().backward()
    (yb ** 2).sum().backward()
    np.testing.assert_allclose(xb.grad.numpy(), xa.grad.numpy(), rtol=1e-12)
    for (na, pa), (nb, pb) in zip(ref.named_parameters(), moe.named_parameters()):
        assert na == nb and (pa.grad is None) == (pb.grad is None)
        if pa.grad is not None:
            np.testing.assert_allclose(pb.grad.numpy(), pa.grad.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(moe.tokens_per_expert, ref.tokens_per_expert)
    assert moe.dropped_tokens == ref.dropped_tokens > 0 and moe.all_to_all_bytes == 0
