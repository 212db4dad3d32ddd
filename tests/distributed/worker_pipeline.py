"""Under ``mpiexec -n P`` (P = 2 or 4, one pipeline; ``--cuda``: one GPU per rank over NCCL): a tiny GPT-2 split
into P stages (PipelinedLM) against the whole model built from the same seed, on the same M = 8 micro-batches, for
every schedule (interleaved, zbv and dualpipev with V = 2):

- the mean loss and every gradient (the tied embedding's summed over its two copies) equal the whole model's;
- each stage holds at most the activations the schedule promises: M micro-batches under gpipe, P - stage under 1f1b,
  P under zb1p (its deferred weight halves keep theirs), 2P chunk activations under zbv (2P + 1 under dualpipev);
  the split schedules report the bytes their pending weight halves hold;
- the sequential forward (validation, generation) gives the whole model's loss and last-position logits;
- gathered on rank 0 (RunState.gather) the stages' state is the whole model's state dict, and after an AdamW step
  the whole AdamW state dict (numbering included); the whole model's checkpoint read back by every stage
  (RunState.load) gives each stage the optimizer state it holds.
Prints "rank R: pipeline ok".
"""
import os
import shutil
import sys
import tempfile
from types import SimpleNamespace

import numpy as np

import infini_train as it
from infini_train import distributed as dist
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.pipeline_lm import PipelinedLM
from infini_train.nn.parallel.pipeline_schedules import SPLIT_SCHEDULES
from infini_train.run_state import RunState, save_checkpoint
from infini_train.nn.parallel.tensor_parallel import all_reduce_grads

on_gpu = "--cuda" in sys.argv
dist.init_process_group("nccl" if on_gpu else "mpi")
rank, world = dist.get_rank(), dist.get_world_size()
device = it.device(f"cuda:{dist.get_local_rank()}" if on_gpu else "cpu")
group = dist.default_group()
config = GPT2Config(block_size=16, vocab_size=67, n_layer=8, n_head=2, n_embd=16)
M = 8
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb1p", 1), ("zbv", 2), ("dualpipev", 2))
rng = np.random.default_rng(0)
xs = [it.tensor(rng.integers(0, 67, (2, 16)), device=device) for _ in range(M)]
ys = [it.tensor(rng.integers(0, 67, (2, 16)), device=device) for _ in range(M)]
embedding_group = dist.new_group([0, world - 1])


def build():
    it.manual_seed(0)
    return GPT2(config).to(device)


def close(a, b, what, rtol=1e-5, atol=1e-6):
    a, b = (np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in (a, b))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"rank {rank}: {what}")


whole = build()
for x, y in zip(xs, ys):
    (whole(x, y)[1] / M).backward()
whole_loss = np.mean([whole(x, y)[1].item() for x, y in zip(xs, ys)])
whole_grads = {n: p.grad.numpy() for n, p in whole.named_parameters()}



def sum_tied(stage):
    """The tied embedding's gradient summed over its copies: over the embedding group, or on the first stage in a V."""
    shared = stage.shared_embedding_params()
    if stage.shared_on_one_stage:
        if len(shared) == 2:
            total = shared[0].grad.array + shared[1].grad.array
            for p in shared:
                p.grad.array[...] = total
    elif rank in (0, world - 1):
        all_reduce_grads([p.grad for p in shared], embedding_group)


for schedule, virtual in SCHEDULES:
    stage = PipelinedLM(build(), group, schedule, virtual)
    loss = stage.train_step(xs, ys, backward=lambda loss: (loss / M).backward())
    close(loss, whole_loss, f"{schedule} loss")
    sum_tied(stage)
    for name, p in stage.state_dict(keep_vars=True).items():
        expected = whole_grads["transformer.wte.weight" if name == "lm_head.weight" else name]
        close(p.grad, expected, f"{schedule} gradient of {name}")
    peak = stage.pipe.stats["peak_live_microbatches"]
    promised = {"gpipe": M, "1f1b": min(world - rank, M), "zb1p": min(world, M), "zbv": 2 * world,
                "dualpipev": 2 * world + (M >= 2 * world - rank)}.get(schedule)
    assert (stage.pipe.stats["peak_weight_bytes"] > 0) == (schedule in SPLIT_SCHEDULES), (schedule, rank)
    assert promised is None or peak == promised, (schedule, rank, peak, promised)

stage = PipelinedLM(build(), group, "1f1b")
stage.eval()
whole.eval()
_, loss = stage(xs[0], ys[0])
close(loss, whole(xs[0], ys[0])[1], "sequential forward loss")
cache, whole_cache = stage.new_kv_cache(2, device), whole.new_kv_cache(2, device)
logits, _ = stage(xs[0][:, :5], kv_cache=cache, last_only=True)
close(logits, whole(xs[0][:, :5], kv_cache=whole_cache, last_only=True)[0], "generation logits")
logits, _ = stage(xs[0][:, 5:6], kv_cache=cache, last_only=True)  # one more token through the stages' caches
close(logits, whole(xs[0][:, 5:6], kv_cache=whole_cache, last_only=True)[0], "cached generation logits")
tokens = stage.generate(xs[0][:1, :3], 6, temperature=0)
assert tokens.numpy().tolist() == whole.generate(xs[0][:1, :3], 6, temperature=0).numpy().tolist()

dims = SimpleNamespace(tensor_parallel=False, pipeline_parallel=True, world=world, dp_rank=0, dp_size=1)
state, _ = RunState(stage, it.optim.AdamW(stage.optimizer_groups(0.1), lr=1e-3), dims).gather()
assert (state is None) == (rank != 0)
if state is not None:
    reference = whole.state_dict()
    assert list(state) == list(reference)
    for name in reference:
        close(state[name], reference[name], f"gathered {name}", rtol=0, atol=0)

stage.train()
whole.train()
for x, y in zip(xs, ys):  # one micro-batch at a time: the same gradients as the whole model's
    stage.train_step([x], [y], backward=lambda loss: (loss / M).backward())
opt = it.optim.AdamW(stage.optimizer_groups(0.1), lr=1e-3)
whole_opt = it.optim.AdamW(whole.optimizer_groups(0.1), lr=1e-3)
if rank in (0, world - 1):
    all_reduce_grads([p.grad for p in stage.shared_embedding_params()], embedding_group)
opt.step()
whole_opt.step()
run_state = RunState(stage, opt, dims)
_, gathered = run_state.gather()
if rank == 0:
    ref = whole_opt.state_dict()
    assert gathered["param_groups"] == ref["param_groups"], (gathered["param_groups"], ref["param_groups"])
    assert list(gathered["state"]) == list(ref["state"])
    for i, entry in ref["state"].items():
        for key, value in entry.items():
            close(gathered["state"][i][key], value, f"optimizer {key} of {i}", rtol=1e-4)
mine = opt.state_dict()
out = [None] * world
dist.all_gather_object(out, tempfile.mkdtemp() if rank == 0 else None)
if rank == 0:
    save_checkpoint(out[0], 1, whole.state_dict(), whole_opt.state_dict(), {})
dist.barrier()
run_state.load(os.path.join(out[0], "checkpoints", "step_000001"))
local = opt.state_dict()
assert local["param_groups"] == mine["param_groups"]
for i, entry in mine["state"].items():
    for key, value in entry.items():
        close(local["state"][i][key], value, f"local {key} of {i}", rtol=1e-4)
dist.barrier()
if rank == 0:
    shutil.rmtree(out[0])

print(f"rank {rank}: pipeline ok", flush=True)
dist.destroy_process_group()
