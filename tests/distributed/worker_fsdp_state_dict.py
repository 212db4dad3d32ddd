"""Under ``mpiexec -n N`` with a directory argument: a GPT-2 fully sharded over N ranks.

- its full state dict (rank 0's, cpu_offload) equals the one-process model's state_dict bitwise; the other ranks
  get {};
- ``model.state_dict()`` holds each rank's shard with its placement, and the ranks' pieces tile every tensor;
- after two AdamW steps the sharded model and optimizer state are saved with it.distributed.checkpoint (rank 0
  also writes the full states, DIR/full_model.it and DIR/full_optim.it, for the test to compare with a one-process
  load); loaded into a fresh sharded model, and broadcast from rank 0's full state into another, both hold the same
  state bitwise and take the same next step.
Prints "rank R: fsdp state dict ok"."""
import os
import sys

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed import checkpoint as dcp
from infini_train.distributed.checkpoint import (ShardedTensor, StateDictOptions, get_model_state_dict,
                                                 get_optimizer_state_dict, set_model_state_dict,
                                                 set_optimizer_state_dict)
from tests.distributed.fsdp_cases import batches, build, sharded

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
directory = sys.argv[1]
FULL = StateDictOptions(full_state_dict=True)
FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
BROADCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def assert_same(a, b, what):
    """Nested state dicts (and tuples or lists of them) equal: the same keys in the same order, tensors bitwise."""
    if isinstance(a, dict):
        assert list(a) == list(b), (what, list(a)[:4], list(b)[:4])
        for key in a:
            assert_same(a[key], b[key], f"{what}[{key!r}]")
    elif isinstance(a, (tuple, list)) and any(isinstance(v, dict) for v in a):
        assert len(a) == len(b), what
        for k, (u, v) in enumerate(zip(a, b)):
            assert_same(u, v, f"{what}[{k}]")
    elif hasattr(a, "numpy"):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=what)
    else:
        assert a == b, (what, a, b)


def full_states(model, optimizer):
    return get_model_state_dict(model, options=FULL), get_optimizer_state_dict(model, optimizer, options=FULL)


def step(model, optimizer, x, y):
    lo, hi = rank * len(x) // world, (rank + 1) * len(x) // world
    _, loss = model(it.tensor(x[lo:hi]), it.tensor(y[lo:hi]))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


reference = build()
model = sharded(build())
full = get_model_state_dict(model, options=FULL_ON_RANK0)
if rank == 0:
    assert_same(full, reference.state_dict(), "full state")
else:
    assert full == {}, list(full)[:3]

held = np.zeros(1, np.int64)
for key, value in model.state_dict().items():
    assert isinstance(value, ShardedTensor) and value.shape == tuple(reference.state_dict()[key].shape), key
    assert list(value.group.ranks) == list(range(world)) and value.rank == rank, key
    start, stop = value.local_range
    whole = reference.state_dict()[key].numpy().reshape(-1)
    np.testing.assert_array_equal(value.to_local().numpy(), whole[start:stop], err_msg=key)
    held += stop - start
total = it.Tensor(held)
dist.all_reduce(total)
assert int(total.numpy()[0]) == sum(v.numel() for v in reference.state_dict().values()), total

optimizer = it.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
data = batches(3)
for x, y in data[:2]:
    step(model, optimizer, x, y)
path = os.path.join(directory, "checkpoint")
dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)},
         checkpoint_id=path)
saved = full_states(model, optimizer)
full_model = get_model_state_dict(model, options=FULL_ON_RANK0)
full_optim = get_optimizer_state_dict(model, optimizer, options=FULL_ON_RANK0)
if rank == 0:
    it.save(full_model, os.path.join(directory, "full_model.it"))
    it.save(full_optim, os.path.join(directory, "full_optim.it"))

fresh = sharded(build(5))
fresh_optimizer = it.optim.AdamW(fresh.parameters(), lr=0.5)
state = {"model": get_model_state_dict(fresh), "optim": get_optimizer_state_dict(fresh, fresh_optimizer)}
dcp.load(state, checkpoint_id=path)
set_model_state_dict(fresh, state["model"])
set_optimizer_state_dict(fresh, fresh_optimizer, state["optim"])
assert_same(full_states(fresh, fresh_optimizer), saved, "loaded")

third = sharded(build(6))
third_optimizer = it.optim.AdamW(third.parameters(), lr=0.5)
set_model_state_dict(third, full_model if rank == 0 else {}, options=BROADCAST)
set_optimizer_state_dict(third, third_optimizer, full_optim if rank == 0 else {}, options=BROADCAST)
assert_same(full_states(third, third_optimizer), saved, "broadcast")

x, y = data[2]
losses = [step(m, o, x, y) for m, o in ((model, optimizer), (fresh, fresh_optimizer), (third, third_optimizer))]
assert losses[0] == losses[1] == losses[2], losses
assert_same(full_states(fresh, fresh_optimizer), full_states(model, optimizer), "after a step")
print(f"rank {rank}: fsdp state dict ok", flush=True)
