"""Started by ``launch/run.sh -n 2``: the world is initialised lazily by the first collective (no
init_process_group call) and the launcher's environment reaches every rank. Prints one line per rank."""
import os

import infini_train as it
from infini_train import distributed as dist

t = it.ones(3) * (dist.get_rank() + 1)  # get_rank() initialises the world on first use
dist.all_reduce(t, "avg")
env = " ".join(f"{k}={os.environ.get(k)}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NCCL_DEBUG",
                                                     "PYTHONUNBUFFERED"))
print(f"rank {dist.get_rank()}/{dist.get_world_size()} backend {dist.get_backend()} avg {t.tolist()} {env}",
      flush=True)
