"""Under ``mpiexec -n N``: one training step of a tiny GPT-2 with ZeroRedundancyOptimizer(AdamW) at ZeRO-1 and
ZeRO-2, then the optimizer's own arrays are measured: each rank holds its 1/N share of what AdamW holds without
ZeRO (the shards are equal but for the last, padded one), the gradients of ZeRO-2 are a shard too, and the
whole parameters agree on every rank after the step."""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.optim import ZeroRedundancyOptimizer
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn.parallel import DistributedDataParallel

dist.init_process_group("mpi")
rank, world = dist.get_rank(), dist.get_world_size()
rng = np.random.default_rng(rank)
x = it.tensor(rng.integers(0, 64, (2, 16)))
y = it.tensor(rng.integers(0, 64, (2, 16)))


def model():
    it.manual_seed(0)
    return GPT2(GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))


def state_bytes(optimizer):
    return sum(v.nbytes for st in optimizer.state.values() for v in st.values() if hasattr(v, "nbytes"))


baseline = model()
plain = baseline.configure_optimizers(0.1, 1e-3)
_, loss = baseline(x, y)
loss.backward()
plain.step()
whole = state_bytes(plain)
n_params = sum(p.numel() for p in baseline.parameters())

for stage in (1, 2):
    m = model()
    opt = ZeroRedundancyOptimizer(m.optimizer_groups(0.1), optimizer_class=it.optim.AdamW, lr=1e-3)
    ddp = DistributedDataParallel(m, zero_optimizer=opt, zero_stage=stage)
    _, loss = ddp(x, y)
    loss.backward()
    opt.step()
    share = opt.state_bytes()
    shard = -(-n_params // world)
    assert share == 8 * min(shard, n_params - rank * shard), (stage, rank, share, whole)  # two float32 moments
    assert abs(share - whole / world) <= 8 * world, (share, whole)
    if stage == 2:
        assert all(p.grad is None for p in m.parameters())  # no whole gradient kept
        assert opt.spaces[0].grad_shard.size == shard
    else:
        assert opt.spaces[0].grad_shard is None  # ZeRO-1 reads its shard of the whole gradients: no shard buffer
    flat = it.tensor(np.concatenate([p.numpy().ravel() for p in m.parameters()]))
    parts = [it.zeros(flat.numel()) for _ in range(world)]
    dist.all_gather(parts, flat)
    assert all(np.array_equal(parts[0].numpy(), q.numpy()) for q in parts)
print(f"rank {rank}: share ok", flush=True)
dist.destroy_process_group()
