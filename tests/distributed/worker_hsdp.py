"""Under ``mpiexec -n 4``: a GPT-2 fully sharded over a HybridShardMesh (HSDP: 2 replicas x 2 shards) gives the
one-process losses and clipped gradient norms for 6 steps (rtol 1e-5) and the same weights, each rank holding about
half the parameters, the two replicas the same shards. Per step the shard group carries the all-gathers and
reduce-scatters and the replicate group only all-reduces (the reduced gradient shards), counted by the run's
communication counters. Prints "rank R: hsdp ok"."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.fsdp import HybridShardMesh
from tests.adam_bounds import assert_close_after_adam
from tests.distributed.fsdp_cases import LR, batches, build, reference_steps, sharded, sharded_steps

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = HybridShardMesh.build(replicate=2)
assert mesh.shard_group.ranks == ([0, 1] if rank < 2 else [2, 3]), mesh
assert mesh.replicate_group.ranks == ([0, 2] if rank % 2 == 0 else [1, 3]), mesh


def mean(value):
    total = it.Tensor(np.array([value], np.float64))
    dist.all_reduce(total, "avg")
    return float(total.numpy()[0])


data = batches(6, batch=8)
reference = build()
want = reference_steps(reference, data)
model = sharded(build(), mesh)
whole = sum(p.numel() for p in model.parameters())
spaces = [s for m in model.modules() if getattr(m, "_fsdp", None) and m._fsdp.unit for s in m._fsdp.unit.spaces]
held = sum(s.shard.size for s in spaces)
assert held <= whole / 2 + 64, (held, whole)
with dist.count_communication() as counts:
    got = sharded_steps(model, data, rank, world, reduce_loss=mean)
np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
np.testing.assert_allclose(got[1], want[1], rtol=1e-5)
by_group = {}
for name, ranks, _, nbytes in counts.rows():
    by_group.setdefault(ranks, {})[name] = nbytes
replicas = tuple(mesh.replicate_group.ranks)
assert set(by_group[replicas]) == {"all_reduce"}, by_group  # only the reduced gradient shards cross replicas
assert by_group[replicas]["all_reduce"] == 6 * 4 * held, (by_group, held)  # each float32 shard once per step
shards = by_group[tuple(mesh.shard_group.ranks)]
assert shards["all_gather_into_tensor"] > 0 and shards["reduce_scatter_tensor"] > 0, by_group
mine = np.concatenate([s.shard.reshape(-1) for s in spaces])
both = it.Tensor(np.empty(2 * mine.size, mine.dtype))
dist.all_gather_into_tensor(both, it.Tensor(mine), group=mesh.replicate_group)
np.testing.assert_array_equal(both.numpy()[:mine.size], both.numpy()[mine.size:])  # the replicas' shards agree
with model.unsharded():
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close_after_adam(p.numpy(), q.numpy(), LR, len(data), err_msg=name)
print(f"rank {rank}: hsdp ok", flush=True)
