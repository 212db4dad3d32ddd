"""Under ``mpiexec -n 2``: a GPT-2 under DistributedDataParallel (each rank seeded differently, so the values seen
are rank 0's broadcast) trains a step; rank 0 writes ``it.save(ddp.state_dict(), DIR/ddp.it)``; every rank loads
it into a fresh DDP wrapper and gets the trained values under torch's ``module.`` keys. Prints "rank R: ddp state
ok"."""
import os
import sys

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("mpi")
rank = dist.get_rank()
path = os.path.join(sys.argv[1], "ddp.it")
config = GPT2Config(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)


def build(seed):
    it.manual_seed(seed)
    return GPT2(config)


ddp = DDP(build(10 + rank))
opt = it.optim.AdamW(ddp.parameters(), lr=1e-2)
rng = np.random.default_rng(rank)
x, y = rng.integers(0, 64, (2, 16)), rng.integers(0, 64, (2, 16))
ddp(it.tensor(x), it.tensor(y))[1].backward()
opt.step()
state = ddp.state_dict()
assert list(state) == ["module." + k for k in ddp.module.state_dict()], list(state)[:3]
if rank == 0:
    it.save(state, path)
dist.barrier()
fresh = DDP(build(20 + rank))
assert fresh.load_state_dict(it.load(path)) == ([], [])
for (name, p), q in zip(fresh.module.named_parameters(), ddp.module.parameters()):
    np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
print(f"rank {rank}: ddp state ok", flush=True)
