"""Under ``mpiexec -n N`` (one tensor group; ``--sequence-parallel``; ``--out DIR``): LoRA on a tiny GPT-2 split with
parallelize_gpt2 against the one-process LoRA model built from the same seed, on the same batch:

- fresh adapters are the one-process ones (same draws); loaded whole adapters give every rank its parts;
- the loss, and every adapter gradient once gathered whole, equal the one-process model's; base weights get none;
- merging and unmerging keep the loss; save_adapter writes the one-process files; load_adapter of those files into
  a fresh split model gives the same loss;
- layers the GPT-2 split does not use: a column-parallel layer with fused blocks and gather_output, a row-parallel
  layer with a whole input.
"""
import os
import sys

import numpy as np
from safetensors.numpy import load_file

import infini_train as it
from infini_train import distributed as dist
from infini_train import nn
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.gpt2.parallel import parallelize_gpt2
from infini_train.nn import lora
from infini_train.nn.parallel import (ColumnParallelLinear, RowParallelLinear, all_reduce_sequence_parallel_grads,
                                      whole_from_shards)

dist.init_process_group("mpi")
rank, group = dist.get_rank(), dist.default_group()
sequence_parallel = "--sequence-parallel" in sys.argv
out = sys.argv[sys.argv.index("--out") + 1]
TARGETS = ["c_attn", "c_proj", "c_fc"]
config = GPT2Config(block_size=16, vocab_size=67, n_layer=2, n_head=4, n_embd=32)
rng = np.random.default_rng(0)
batch = rng.integers(0, 67, (2, 17))
x, y = it.tensor(batch[:, :-1]), it.tensor(batch[:, 1:])
checks = 0


def close(a, b, what, rtol=1e-5, atol=1e-6):
    global checks
    a, b = (v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in (a, b))
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"rank {rank}: {what}")
    checks += 1


def whole_model():
    it.manual_seed(0)
    return lora.apply_lora(GPT2(config), 4, 8, target_modules=TARGETS)


def split_model(adapters=True):
    it.manual_seed(0)
    model = parallelize_gpt2(GPT2(config), group, sequence_parallel)
    return lora.apply_lora(model, 4, 8, target_modules=TARGETS) if adapters else model


def loss_of(model):
    _, loss = model(x, y)
    return loss


whole, split = whole_model(), split_model()
fresh_whole, fresh_split = lora.lora_state_dict(whole), lora.lora_state_dict(split, whole=True)
assert list(fresh_split) == list(fresh_whole)
for name in fresh_whole:
    close(fresh_split[name], fresh_whole[name], f"fresh {name}", rtol=0, atol=0)

adapter_rng = np.random.default_rng(1)
with it.no_grad():
    for p in lora.lora_parameters(whole):
        p.copy_(it.tensor(adapter_rng.normal(0, 0.1, p.shape).astype(np.float32)))
lora.load_lora_state_dict(split, lora.lora_state_dict(whole))
for name, value in lora.lora_state_dict(split, whole=True).items():
    close(value, lora.lora_state_dict(whole)[name], f"loaded {name}", rtol=0, atol=0)

loss_whole, loss_split = loss_of(whole), loss_of(split)
close(loss_split.item(), loss_whole.item(), "loss")
loss_whole.backward()
loss_split.backward()
all_reduce_sequence_parallel_grads(split, group)
whole_params = dict(whole.named_parameters())
marked = []
for name, p in split.named_parameters():
    if not p.requires_grad:
        assert p.grad is None, f"rank {rank}: frozen {name} got a gradient"
        continue
    spec = p.placement.tensor_shard
    grad = whole_from_shards(p.grad.array, spec, group) if spec is not None else p.grad.array
    close(grad, whole_params[name].grad, f"gradient of {name}")
    if p.placement.sequence_parallel:
        marked.append(name.rsplit(".", 3)[-3] + "." + name.rsplit(".", 2)[-2])
if sequence_parallel:  # the column layers' A and the row layers' B see one sequence slice
    assert sorted(set(marked)) == ["c_attn.lora_A", "c_fc.lora_A", "c_proj.lora_B"], marked
else:
    assert not marked, marked

with it.no_grad():
    lora.merge_lora(split)
    close(loss_of(split).item(), loss_whole.item(), "merged loss")
    lora.unmerge_lora(split)
    close(loss_of(split).item(), loss_whole.item(), "unmerged loss")

one_dir, tp_dir = os.path.join(out, "one"), os.path.join(out, "tp")
written = lora.save_adapter(split, tp_dir)
assert (written is not None) == (group.rank == 0)
if rank == 0:
    lora.save_adapter(whole, one_dir)
group.barrier()
if rank == 0:
    one, tp = load_file(os.path.join(one_dir, "adapter_model.safetensors")), \
        load_file(os.path.join(tp_dir, "adapter_model.safetensors"))
    assert set(one) == set(tp) and len(one) == 16
    for key in one:
        close(tp[key], one[key], f"saved {key}", rtol=0, atol=0)
    configs = []
    for directory in (one_dir, tp_dir):
        with open(os.path.join(directory, "adapter_config.json")) as f:
            configs.append(f.read())
    assert configs[0] == configs[1]
reloaded = lora.load_adapter(split_model(adapters=False), one_dir)
with it.no_grad():
    close(loss_of(reloaded).item(), loss_whole.item(), "loss after load_adapter")

# layers parallelize_gpt2 does not build: fused column blocks gathered, a row layer scattering its whole input
it.manual_seed(3)
inputs = it.randn(2, 4, 8)
for build, what in ((lambda lin: ColumnParallelLinear.from_linear(lin, group, blocks=3, gather_output=True),
                     "column, blocks=3, gather_output"),
                    (lambda lin: RowParallelLinear.from_linear(lin, group, input_is_parallel=False),
                     "row, whole input")):
    it.manual_seed(4)
    plain = lora.LoRALinear(nn.Linear(8, 12), 2, 4)
    with it.no_grad():
        plain.lora_B.weight.copy_(it.tensor(adapter_rng.normal(0, 0.5, (12, 2)).astype(np.float32)))
    parallel = lora.lora_layer(build(plain.base_layer), 2, 4)
    lora.load_lora_state_dict(parallel, lora.lora_state_dict(plain))
    xs = [inputs.detach().requires_grad_(True) for _ in range(2)]
    ys = [plain(xs[0]), parallel(xs[1])]
    close(ys[1], ys[0], f"{what}: output")
    g = it.tensor(adapter_rng.normal(size=tuple(ys[0].shape)).astype(np.float32))
    for result in ys:
        result.backward(g)
    close(xs[1].grad, xs[0].grad, f"{what}: input gradient")
    for part in ("lora_A", "lora_B"):
        p = getattr(parallel, part).weight
        spec = p.placement.tensor_shard
        grad = whole_from_shards(p.grad.array, spec, group) if spec is not None else p.grad.array
        close(grad, getattr(plain, part).weight.grad, f"{what}: {part} gradient")

print(f"rank {rank} LoRA TP OK {checks}", flush=True)
dist.destroy_process_group()
