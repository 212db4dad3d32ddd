"""Run under ``mpiexec -n 3`` with a hang directory and a mode; the job must end within the timeout (3 s) plus the
hang report's grace period and a few seconds, every rank's stack on disk:

- ``collective``: every rank all-reduces once; then the last rank sleeps (it never arrives) while the others
  all-reduce again: their wait times out (uncaught: the job is aborted), naming the last rank, after every rank wrote
  hang_dir/rank<R>.txt.
- ``transfer``: rank 0 waits to receive from rank 1, which sleeps instead of sending; rank 2 sleeps too (a bystander):
  the receive times out naming rank 1.
"""
import sys
import time

import numpy as np

import infini_train as it
from infini_train import distributed as dist

mode, hang_dir = sys.argv[1], sys.argv[2]
dist.init_process_group("mpi", timeout=3.0)
rank, last = dist.get_rank(), dist.get_world_size() - 1
dist.set_hang_dir(hang_dir)
dist.all_reduce(it.ones(4))
print(f"rank {rank} ready at {time.time():.3f}", flush=True)


def asleep_in_user_code():
    time.sleep(120)  # a rank that never arrives: its stack shows this function


if mode == "collective":
    if rank == last:
        asleep_in_user_code()
    dist.all_reduce(it.tensor(np.ones(1024, np.float32)))  # 4 KB: collective 2 of the world (1: the first)
elif mode == "transfer":
    if rank == 0:
        dist.recv(it.tensor(np.zeros(8)), 1)
    else:
        asleep_in_user_code()
print(f"rank {rank} should not get here", flush=True)
