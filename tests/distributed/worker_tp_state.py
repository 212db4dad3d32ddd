"""Under ``mpiexec -n N`` (N = 2 or 4, one tensor group; ``--cuda``: one GPU per rank over NCCL): a tiny GPT-2
split with parallelize_gpt2 against the whole model built from the same seed, on the same batch:

- the loss, and every gradient once gathered whole, equal the whole model's (with sequence parallelism too);
- clip_grad_norm_model_parallel_ (2-norm and inf-norm) gives the whole model's norm and scaling;
- whole_state_dict is the whole model's state dict; loading it back gives every rank its shards;
- the model and AdamW state after a step, gathered whole (RunState.gather), are the whole model's; written as a
  whole checkpoint by the one-process model and read back (RunState.load), every rank gets the state it holds.
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
from infini_train.models.gpt2.parallel import parallelize_gpt2
from infini_train.nn.parallel import all_reduce_sequence_parallel_grads, whole_from_shards
from infini_train.nn.parallel.grad_norm import clip_grad_norm_model_parallel_
from infini_train.nn.parallel.whole_state import load_whole_state_dict, whole_state_dict
from infini_train.run_state import RunState, save_checkpoint
from infini_train.nn.utils import clip_grad_norm_

on_gpu = "--cuda" in sys.argv  # one GPU per rank over NCCL
dist.init_process_group("nccl" if on_gpu else "mpi")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.default_group()
device = f"cuda:{dist.get_local_rank()}" if on_gpu else "cpu"
sequence_parallel = "--sequence-parallel" in sys.argv
config = GPT2Config(block_size=16, vocab_size=67, n_layer=2, n_head=4, n_embd=32)  # 67: padded at every size
rng = np.random.default_rng(0)
x = it.tensor(rng.integers(0, 67, (2, 16)), device=device)
y = it.tensor(rng.integers(0, 67, (2, 16)), device=device)


def build():
    it.manual_seed(0)
    return GPT2(config).to(device)


def host(a):
    a = a.array if hasattr(a, "array") else a
    return a.get() if hasattr(a, "get") else np.asarray(a)


def close(a, b, what, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(host(a), host(b), rtol=rtol, atol=atol, err_msg=what)


whole, split = build(), parallelize_gpt2(build(), group, sequence_parallel)
_, loss_whole = whole(x, y)
_, loss_split = split(x, y)
close(loss_split.item(), loss_whole.item(), "loss")
loss_whole.backward()
loss_split.backward()
all_reduce_sequence_parallel_grads(split, group)
names_whole = dict(whole.named_parameters())
for name, p in split.named_parameters():
    spec = p.placement.tensor_shard
    grad = whole_from_shards(p.grad.array, spec, group) if spec is not None else p.grad.array
    close(grad, names_whole[name].grad.numpy(), f"gradient of {name}")

for norm_type in (2.0, float("inf")):
    whole_grads = {n: p.grad.numpy().copy() for n, p in whole.named_parameters()}
    split_grads = {n: p.grad.numpy().copy() for n, p in split.named_parameters()}
    expected = clip_grad_norm_(whole.parameters(), 0.01, norm_type).item()
    got = clip_grad_norm_model_parallel_(split.parameters(), 0.01, group, norm_type=norm_type).item()
    close(got, expected, f"{norm_type}-norm")
    ratio = {n: p.grad.numpy() / np.where(split_grads[n] == 0, 1, split_grads[n]) for n, p in split.named_parameters()}
    scale = 0.01 / (expected + 1e-6)
    for n in ratio:
        close(ratio[n][split_grads[n] != 0], scale, f"scaling of {n}", rtol=1e-4)
    for n, p in whole.named_parameters():  # undo, for the next norm
        p.grad.copy_(it.tensor(whole_grads[n], device=device))
    for n, p in split.named_parameters():
        p.grad.copy_(it.tensor(split_grads[n], device=device))

state = whole_state_dict(split, group)
reference = whole.state_dict()
assert list(state) == list(reference), (list(state), list(reference))
for name in reference:
    close(state[name].numpy(), reference[name].numpy(), f"whole {name}", rtol=0, atol=0)
kept = whole_state_dict(split, group, to=0)  # only group rank 0 keeps the whole tensors
assert (kept is None) == (rank != 0)
if kept is not None:
    for name in reference:
        close(kept[name].numpy(), reference[name].numpy(), f"kept {name}", rtol=0, atol=0)
shards_before = {n: p.numpy().copy() for n, p in split.named_parameters()}
for p in split.parameters():
    p.array[...] = 0
load_whole_state_dict(split, reference, group)
for n, p in split.named_parameters():
    close(p.numpy(), shards_before[n], f"reloaded shard {n}", rtol=0, atol=0)

opt_whole = it.optim.AdamW(whole.optimizer_groups(0.1), lr=1e-3)
opt_split = it.optim.AdamW(split.optimizer_groups(0.1), lr=1e-3)
opt_whole.step()
opt_split.step()
dims = SimpleNamespace(tensor_parallel=True, tp_rank=rank, tp_size=world, pipeline_parallel=False, world=world,
                       dp_rank=0, dp_size=1)
run_state = RunState(split, opt_split, dims)
model_state, whole_state = run_state.gather()
assert (whole_state is None) == (rank != 0)
ref_state = opt_whole.state_dict()
whole_now = whole_state_dict(split, group)  # (the model after the step, gathered by the tensor-parallel layers)
if rank == 0:
    assert list(model_state) == list(whole_now)
    for name, value in whole_now.items():
        close(model_state[name], value, f"gathered {name}", rtol=0, atol=0)
    assert whole_state["param_groups"] == ref_state["param_groups"]
    assert list(whole_state["state"]) == list(ref_state["state"])
    for i, entry in ref_state["state"].items():
        for key, value in entry.items():
            close(whole_state["state"][i][key], value, f"{key} of parameter {i}", rtol=1e-4)
mine = opt_split.state_dict()
out = [None] * world
dist.all_gather_object(out, tempfile.mkdtemp() if rank == 0 else None)
if rank == 0:
    save_checkpoint(out[0], 1, whole.state_dict(), ref_state, {})
dist.barrier()
for st in opt_split.state.values():
    for value in st.values():
        if hasattr(value, "shape"):
            value[...] = 0
run_state.load(os.path.join(out[0], "checkpoints", "step_000001"))
again = opt_split.state_dict()
for i, entry in mine["state"].items():
    for key, value in entry.items():
        close(again["state"][i][key], value, f"resharded {key} of {i}", rtol=1e-4)
dist.barrier()
if rank == 0:
    shutil.rmtree(out[0])

print(f"rank {rank}: tp state ok", flush=True)
dist.destroy_process_group()
