"""Under ``mpiexec -n 4``: the run's model built on the meta device and given its values by sharded initialisation
(each rank draws the whole model's stream, keeping only its part) is, gathered whole, bitwise the model a one-process
build makes eagerly from the same seed, for GPT-2 and LLaMA (tied and untied) under TP2 x DP2 with sequence
parallelism, PP2 x TP2 interleaved, PP2 x DP2, PP4 and under ZeRO-3 (each rank initialising only its flat shards: DP4,
TP2 x DP2 with sequence parallelism, PP2 x DP2). Prints "rank R: sharded init ok"."""
import numpy as np

from infini_train import backend
from infini_train import distributed as dist
from infini_train.models import registry
from infini_train.optim import AdamW
from infini_train.training.config import load_config
from infini_train.training.model_build import build_model
from infini_train.training.parallel_dims import ParallelDims
from infini_train.run_state import RunState

dist.init_process_group("mpi")
rank = dist.get_rank()
MODELS = {"gpt2": ["model.n_layer=4", "model.n_embd=32", "model.n_head=4", "model.block_size=16",
                   "model.vocab_size=257"],
          "llama3": ["model.arch=llama3", "model.n_layer=4", "model.n_embd=32", "model.n_head=4", "model.n_kv_head=2",
                     "model.block_size=16", "model.vocab_size=257", "model.rope_scaling_factor=0"],
          "llama3-untied": ["model.arch=llama3", "model.n_layer=4", "model.n_embd=32", "model.n_head=4",
                            "model.n_kv_head=2", "model.block_size=16", "model.vocab_size=257",
                            "model.rope_scaling_factor=0", "model.tie_embeddings=false"]}
LAYOUTS = {"tp2xdp2-sp": ["parallel.tensor=2", "parallel.sequence=true"],
           "pp2xtp2-interleaved": ["parallel.pipeline=2", "parallel.tensor=2", "parallel.pipeline_schedule=interleaved",
                                   "parallel.virtual_pipeline=2"],
           "pp2xdp2": ["parallel.pipeline=2"], "pp4": ["parallel.pipeline=4"],
           "zero3x4": ["parallel.zero_stage=3"], "zero3x2-tp2-sp": ["parallel.zero_stage=3", "parallel.tensor=2",
                                                                    "parallel.sequence=true"],
           "pp2-zero3x2": ["parallel.zero_stage=3", "parallel.pipeline=2"]}
for model_name, model_args in MODELS.items():
    common = ["data.source=null", "train.sequence_length=16", "device=cpu", "seed=7", *model_args]
    cfg = load_config(None, common)
    backend.manual_seed(cfg.seed)
    cls, _ = registry.model_class(cfg.model.arch)
    eager = cls(cfg.model.to_model_config()).state_dict()
    for layout, parallel in LAYOUTS.items():
        cfg = load_config(None, common + parallel)
        p = cfg.parallel
        dims = ParallelDims(p.tensor, p.sequence, p.pipeline, p.virtual_pipeline, p.pipeline_schedule)
        model = build_model(cfg, backend.CPU, dims)[0].model
        whole, _ = RunState(model, AdamW(model.optimizer_groups(0.0), lr=1e-3), dims).gather()  # (ZeRO-3: shards)
        if rank == 0:
            assert sorted(whole) == sorted(eager), (model_name, layout, set(whole) ^ set(eager))
            for name in eager:
                assert np.array_equal(whole[name], eager[name].numpy()), (model_name, layout, name)
print(f"rank {rank}: sharded init ok", flush=True)
