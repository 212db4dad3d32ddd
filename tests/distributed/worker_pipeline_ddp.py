"""Under ``mpiexec -n 4``: a tiny GPT-2 as two pipeline stages x two data-parallel replicas, each local chunk wrapped
in DistributedDataParallel (plain, and with a ZeRO-1 optimizer's reducer), for every schedule (interleaved, zbv and
dualpipev with V = 2). Each replica runs its own M = 4 micro-batches. Checks:

- every gradient (the tied embedding's summed over its two copies afterwards) is the average over the replicas of
  the whole model's gradients on their micro-batches;
- each chunk reduces once per step, during its last backward (its last weight half where the schedule splits
  backwards): the data group sees exactly one all-reduce per bucket of each chunk, however many micro-batches ran,
  and none before.
Prints "rank R: pipeline ddp ok".
"""
import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.distributed.mesh import ProcessMesh
from infini_train.distributed.optim import ZeroRedundancyOptimizer
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.pipeline_lm import PipelinedLM
from infini_train.nn.parallel import DistributedDataParallel
from infini_train.nn.parallel.tensor_parallel import all_reduce_grads
from infini_train.optim import AdamW

dist.init_process_group("mpi")
rank = dist.get_rank()
mesh = ProcessMesh(pipeline=2)
config = GPT2Config(block_size=16, vocab_size=67, n_layer=4, n_head=2, n_embd=16)
M = 4
rng = np.random.default_rng(0)
batches = [[(it.tensor(rng.integers(0, 67, (2, 16))), it.tensor(rng.integers(0, 67, (2, 16)))) for _ in range(M)]
           for _ in range(mesh.dp_size)]
mine = batches[mesh.dp_rank]


def build():
    it.manual_seed(0)
    return GPT2(config)


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a.numpy()), np.asarray(b), rtol=1e-5, atol=1e-6,
                               err_msg=f"rank {rank}: {what}")


expected = {}
for replica in batches:
    whole = build()
    for x, y in replica:
        (whole(x, y)[1] / M).backward()
    for n, p in whole.named_parameters():
        expected[n] = expected.get(n, 0) + p.grad.numpy() / mesh.dp_size


class CountingGroup:
    """The data group, counting its all-reduces and noting whether each came during a chunk's last backward."""

    def __init__(self, group):
        self.group, self.calls, self.last_backward = group, 0, False

    def __getattr__(self, name):
        return getattr(self.group, name)

    def all_reduce(self, *args, **kwargs):
        assert self.last_backward, f"rank {rank}: a data-parallel all-reduce outside a chunk's last backward"
        self.calls += 1
        return self.group.all_reduce(*args, **kwargs)


def noting_wrapper(chunk, counting, zero, wrappers):
    """DDP over ``chunk`` whose backward preparation tells ``counting`` whether the chunk's last backward runs."""
    ddp = DistributedDataParallel(chunk, process_group=counting, zero_optimizer=zero, zero_stage=1)
    prepare = ddp.prepare_backward

    def prepare_and_note(sync):
        counting.last_backward = sync
        prepare(sync)

    ddp.prepare_backward = prepare_and_note
    wrappers.append(ddp)
    return ddp


for schedule, virtual in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2), ("dualpipev", 2)):
    for zero_stage in (0, 1):
        label = f"{schedule} ZeRO-{zero_stage}"
        stage = PipelinedLM(build(), mesh.pipeline_group, schedule, virtual)
        counting = CountingGroup(mesh.data_group)
        zero = None
        if zero_stage:
            zero = ZeroRedundancyOptimizer(stage.optimizer_groups(0.0), optimizer_class=AdamW,
                                           process_group=counting, flat_order=stage.parameters(), lr=1e-3)
        wrappers = []
        stage.wrap_chunks(lambda chunk, counting=counting, zero=zero, wrappers=wrappers:
                          noting_wrapper(chunk, counting, zero, wrappers))
        stage.train_step([x for x, _ in mine], [y for _, y in mine], backward=lambda loss: (loss / M).backward())
        buckets = sum(len(w.reducer.buckets) for w in wrappers)
        assert counting.calls == buckets, f"rank {rank}: {label}: {counting.calls} all-reduces, {buckets} buckets"
        shared = stage.shared_embedding_params()
        if stage.shared_on_one_stage and shared:  # a V: the embedding and its copy are both on the first stage
            total = shared[0].grad.array + shared[1].grad.array
            for p in shared:
                p.grad.array[...] = total
        elif not stage.shared_on_one_stage and mesh.embedding_group is not None:
            all_reduce_grads([p.grad for p in shared], mesh.embedding_group)
        for name, p in stage.state_dict(keep_vars=True).items():
            close(p.grad, expected["transformer.wte.weight" if name == "lm_head.weight" else name],
                  f"{label}: gradient of {name}")
print(f"rank {rank}: pipeline ddp ok", flush=True)
