"""Run under mpiexec -n 2 with a mode: 'raise' (rank 1 raises mid-job) or 'timeout' (rank 1 skips a barrier)."""
import sys
import time

import infini_train as it
from infini_train import distributed as dist

mode = sys.argv[1]
dist.init_process_group("mpi", timeout=2.0)
rank = dist.get_rank()
if mode == "raise":
    if rank == 1:
        raise ValueError("rank 1 failed on purpose")
    t = it.ones(2)
    dist.all_reduce(t)  # rank 0 would wait forever for rank 1 without the abort
    time.sleep(60)
elif mode == "timeout":
    if rank == 0:
        try:
            dist.all_reduce(it.ones(2))
        except RuntimeError as exc:
            print(f"TIMEOUT: {exc}", flush=True)
            sys.stdout.flush()
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(3)
    else:
        time.sleep(30)
