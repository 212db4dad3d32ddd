"""Run under ``mpiexec -n 2`` with a mode; each mode must end the whole job quickly, never hang:

- ``raise``: rank 1 raises while rank 0 waits in an all_reduce (with a 300 s timeout): the abort-on-failure
  hook must end rank 0 too, within seconds.
- ``thread``: the same with the exception raised in a background thread of rank 1.
- ``exit``: rank 1 calls sys.exit(3) while rank 0 waits in an all_reduce (300 s timeout): the exit guard must
  abort the job within its grace period (set to 2 s by the test).
- ``clean``: both ranks end the script without destroy_process_group(): they exit together, status 0.
- ``pipeline``: a two-stage GPT-2 pipeline; rank 1 raises inside its third point-to-point batch while rank 0 waits
  for a gradient from it (300 s timeout): the abort ends rank 0 within seconds.
- ``pipeline-hang``: rank 1 stops inside the pipeline (sleeps); rank 0's receive times out (2 s), naming the
  transfer and the peer, uncaught: the job is aborted.
- ``timeout``: rank 1 never joins; rank 0's async barrier wait(timeout=1) raises (caught and printed), then a
  sync all_reduce under init_process_group(timeout=2) raises uncaught, which aborts the job.
"""
import sys
import threading
import time

import numpy as np

import infini_train as it
from infini_train import distributed as dist

mode = sys.argv[1]
dist.init_process_group("mpi", timeout=2.0 if mode in ("timeout", "pipeline-hang") else 300.0)
rank = dist.get_rank()
print(f"rank {rank} started", flush=True)

if mode == "raise":
    if rank == 1:
        time.sleep(0.2)
        raise ValueError("rank 1 failed on purpose")
    dist.all_reduce(it.ones(4))  # would wait forever (well, 300 s) for rank 1 without the abort
elif mode == "exit":
    if rank == 1:
        time.sleep(0.2)
        sys.exit(3)
    dist.all_reduce(it.ones(4))
elif mode == "clean":
    dist.all_reduce(it.ones(4))
    print(f"rank {rank} done", flush=True)
    sys.exit(0)
elif mode == "thread":
    if rank == 1:
        def fail():
            raise KeyError("rank 1 background thread failed on purpose")

        threading.Thread(target=fail).start()
        time.sleep(60)
    dist.barrier()
elif mode in ("pipeline", "pipeline-hang"):
    from infini_train.models.gpt2 import GPT2, GPT2Config
    from infini_train.models.pipeline_lm import PipelinedLM

    it.manual_seed(0)
    stage = PipelinedLM(GPT2(GPT2Config(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=8)),
                          dist.default_group(), "1f1b")
    group, calls = dist.default_group(), [0]
    real = group.batch_isend_irecv

    def failing(ops):
        calls[0] += 1
        if rank == 1 and calls[0] == 3:
            if mode == "pipeline":
                raise ConnectionError("rank 1 failed inside a pipeline transfer on purpose")
            time.sleep(60)
        return real(ops)

    group.batch_isend_irecv = failing
    batches = [it.tensor(np.zeros((1, 8), np.int64)) for _ in range(4)]
    stage.train_step(batches, batches)
elif mode == "timeout":
    if rank == 1:
        time.sleep(60)  # never joins
    else:
        work = dist.barrier(async_op=True)
        try:
            work.wait(timeout=1)
        except RuntimeError as exc:
            print(f"CAUGHT: {exc}", flush=True)
        else:
            raise AssertionError("expected the barrier to time out")
        assert not work.is_completed()
        dist.all_reduce(it.tensor(np.ones(3)))  # times out after 2 s, uncaught: aborts the job
print(f"rank {rank} should not get here", flush=True)
