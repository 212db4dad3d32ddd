"""Under ``mpiexec -n 2``: a LoRA run's base weights read from an HF GPT-2 directory and from an llm.c file under
TP2 and under ZeRO-3 x 2: each base tensor's pieces on each rank equal the boxes of the source's whole tensors, the
second rank (which does not compute the pin) reads about half of the model's bytes, and the pin equals
weights_digest of the model loaded whole. Prints "rank R: lora pieces ok"."""
import os
import sys

import numpy as np

from infini_train import backend
from infini_train import distributed as dist
from infini_train import mapped_arrays
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.gpt2.io import save_hf, save_llmc
from infini_train.nn.parallel.sharded_pieces import param_pieces
from infini_train.training.config import load_config
from infini_train.run_state.lora_base import weights_digest
from infini_train.training.lora_run import base_entries
from infini_train.training.model_build import build_model
from infini_train.training.parallel_dims import ParallelDims

dist.init_process_group("mpi")
rank = dist.get_rank()
work = sys.argv[1]
config = GPT2Config(block_size=16, vocab_size=257, n_layer=2, n_head=4, n_embd=64)
backend.manual_seed(3)
source_model = GPT2(config)
reference = {k: v.numpy() for k, v in source_model.state_dict().items()}
whole_bytes = sum(v.nbytes for k, v in reference.items() if k != "lm_head.weight")
sources = {"hf": os.path.join(work, "hf"), "llmc": os.path.join(work, "model.bin")}
if rank == 0:
    save_hf(source_model, sources["hf"])
    save_llmc(source_model, sources["llmc"])
dist.barrier()

read = [0]
original = mapped_arrays.MappedArray.__getitem__


def counting(self, key):
    box = original(self, key)
    read[0] += box.nbytes
    return box


mapped_arrays.MappedArray.__getitem__ = counting
LAYOUTS = {"tp2": ["parallel.tensor=2"], "zero3x2": ["parallel.zero_stage=3"]}
for source_name, path in sources.items():
    for layout, parallel in LAYOUTS.items():
        cfg = load_config(None, ["data.source=null", "device=cpu", "model.n_layer=2", "model.n_embd=64",
                                 "model.n_head=4", "model.block_size=16", "train.sequence_length=16",
                                 "model.vocab_size=257", "lora.rank=4", f"lora.init_from={path}", *parallel])
        p = cfg.parallel
        dims = ParallelDims(p.tensor, p.sequence, p.pipeline, p.virtual_pipeline, p.pipeline_schedule)
        read[0] = 0
        plan, _, base = build_model(cfg, backend.CPU, dims)
        model = plan.model
        tp_rank, tp_size = (dims.tp_rank, dims.tp_size) if dims.tensor_parallel else (0, 1)
        for name, t in base_entries(model):
            for offsets, view in param_pieces(t, tp_rank, tp_size).pieces:
                box = tuple(slice(o, o + n) for o, n in zip(offsets, view.shape))
                assert np.array_equal(np.asarray(view), reference[name][box]), (source_name, layout, name)
        assert base.sha256 == weights_digest(source_model), (source_name, layout)
        if rank == 1:  # (rank 0 also streams every tensor for the pin)
            share = read[0] / whole_bytes
            assert 0.3 < share < (0.6 if layout == "zero3x2" else 0.75), (source_name, layout, share)
print(f"rank {rank}: lora pieces ok", flush=True)
