"""Under ``mpiexec -n N``: ZeroRedundancyOptimizer(AdamW, find_unused_parameters=True) skips the parameters that no
rank got a gradient for in a step, as one process's AdamW skips a .grad of None. Over three steps the ranks use
different layers: layer 0 always, layer 1 on rank 0 in step 0 only, layer 2 on the ranks > 0 in step 0 and on rank
0 in step 2, layer 3 never. ZeRO-1 and ZeRO-2 under DDP's reducer, and ZeRO-1 and 2 reducing at once
(``reduce_gradients``, as pipeline runs do), give the weights of one process's AdamW stepping the average loss
(weight decay on: a wrongly stepped layer would shrink), and their consolidated state is its state: the same
parameters with state (none for layer 3), the same step counts (3, 1, 2) and moments."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.optim import ZeroRedundancyOptimizer
from infini_train.nn.parallel import DistributedDataParallel

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
OPTIONS = dict(lr=1e-2, weight_decay=0.1)


class Layers(it.nn.Module):
    def __init__(self):
        super().__init__()
        it.manual_seed(0)
        self.layers = it.nn.ModuleList([it.nn.Linear(6, 6) for _ in range(4)])

    def forward(self, x, which):
        for k in which:
            x = self.layers[k](x).tanh()
        return (x * x).mean()


def which(step, r):
    if step == 0:
        return [0, 1] if r == 0 else [0, 2]
    return [0, 2] if step == 2 and r == 0 else [0]


def batch(step, r):
    return it.tensor(np.random.default_rng([step, r]).standard_normal((3, 6)).astype(np.float32))


reference = Layers()
adamw = it.optim.AdamW(reference.parameters(), **OPTIONS)
for step in range(3):
    adamw.zero_grad(set_to_none=True)
    loss = sum((reference(batch(step, r), which(step, r)) for r in range(world)), it.tensor(0.0)) / world
    loss.backward()
    adamw.step()
expected = adamw.state_dict()
assert sorted(expected["state"]) == list(range(6)), sorted(expected["state"])  # layer 3 (params 6, 7): none
assert [expected["state"][i]["step"] for i in range(0, 6, 2)] == [3, 1, 2 if world > 1 else 1]

checks = 0
for stage, ddp in ((1, True), (2, True), (1, False), (2, False)):
    model = Layers()
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=it.optim.AdamW, find_unused_parameters=True,
                                  **OPTIONS)
    run = DistributedDataParallel(model, zero_optimizer=opt, zero_stage=stage, find_unused_parameters=True) \
        if ddp else model
    for step in range(3):
        opt.zero_grad()
        run(batch(step, rank), which(step, rank)).backward()
        if not ddp:
            opt.reduce_gradients(shard=stage == 2)
        opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-7, err_msg=f"stage {stage} ddp {ddp}")
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        state = opt.state_dict()["state"]
        assert sorted(state) == sorted(expected["state"]), (stage, ddp, sorted(state))
        for i, st in expected["state"].items():
            assert state[i]["step"] == st["step"], (stage, ddp, i, state[i]["step"], st["step"])
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(state[i][key].numpy(), st[key].numpy(), rtol=1e-5, atol=1e-9,
                                           err_msg=f"stage {stage} ddp {ddp} {i} {key}")
    checks += 1
print(f"rank {rank} unused skipped {checks}", flush=True)
dist.destroy_process_group()
