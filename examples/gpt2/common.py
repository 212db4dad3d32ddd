"""Shared by generate.py and evaluate.py: parse --device and --dtype, load a model (a training checkpoint of any
arch, or pretrained GPT-2 / LLaMA weights) and the tokenizer it was trained with."""
from __future__ import annotations

import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import infini_train as it  # noqa: E402
from infini_train import backend  # noqa: E402
from infini_train.data.tokenizer import get_tokenizer, hf_name  # noqa: E402
from infini_train.models import registry  # noqa: E402
from infini_train.run_state import CheckpointError, load_model_checkpoint  # noqa: E402
from infini_train.training.config import ConfigError  # noqa: E402


DEVICE_FORMS = "cpu, cpu:N, cuda or cuda:N"
DTYPES = ("float32", "float64")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")


def once(message):
    """SystemExit's argument for an error every rank of a job meets: the message on rank 0, exit status 1 elsewhere
    (so the job prints it once)."""
    from infini_train import distributed as dist

    return message if not dist.is_initialized() or dist.get_rank() == 0 else 1


def parse_device(value):
    """--device as a Device; SystemExit naming the option, the accepted forms and a hint otherwise."""
    try:
        return backend.Device.parse(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise SystemExit(f"error: --device: expected {DEVICE_FORMS}, got {value!r}\nHINT: cuda means an NVIDIA "
                         "GPU (needs cupy), e.g. --device cuda:0; --device cpu runs anywhere") from None


def parse_dtype(value):
    """--dtype checked against the dtypes models run in."""
    if value in DTYPES:
        return value
    raise SystemExit(f"error: --dtype: expected one of {', '.join(DTYPES)}, got {value!r}\nHINT: float32 (the "
                     "default) suits every model; float64 is slower and for checking numerics")


def parse_precision(value, device):
    """--precision as a context factory: the forward runs under autocast for bf16-mixed / fp16-mixed."""
    if value not in PRECISIONS:
        import difflib
        close = difflib.get_close_matches(value, PRECISIONS, n=1, cutoff=0.4)
        raise SystemExit(f"error: --precision: expected one of {', '.join(PRECISIONS)}, got {value!r}"
                         + (f" (did you mean {close[0]!r}?)" if close else "")
                         + "\nHINT: bf16-mixed runs the matmuls in bfloat16 with float32 weights")
    from infini_train.training.precision import autocast_for
    return lambda: autocast_for(value, device)


def load_model(checkpoint=None, pretrained=None, device="cpu", tokenizer=None, dtype="float32"):
    """Returns (model in eval mode, tokenizer). Exactly one of checkpoint / pretrained must be given.

    A checkpoint is a run's ``checkpoints/step_XXXXXX`` directory or its out_dir (the newest one is used);
    pretrained is an HF GPT-2 directory or an llm.c .bin file. ``device`` and ``dtype`` are the command line's
    --device and --dtype; the weights are cast to ``dtype`` whatever dtype they were trained in.
    """
    if (checkpoint is None) == (pretrained is None):
        raise SystemExit("error: give exactly one of --checkpoint or --pretrained")
    device, dtype = parse_device(device), parse_dtype(dtype)
    if checkpoint is not None:
        try:
            model, tok_name = _from_checkpoint(checkpoint, dtype)
        except (CheckpointError, ConfigError) as exc:
            raise SystemExit(once(f"error: --checkpoint: {exc}")) from None
        tok_name = tokenizer or tok_name
    else:
        model = _pretrained(pretrained)
        model.to(dtype=dtype)
        own = os.path.isdir(pretrained) and os.path.isfile(os.path.join(pretrained, "tokenizer.json"))
        tok_name = tokenizer or (hf_name(pretrained) if own else None) or {
            257: "byte", 50257: "gpt2", 50304: "gpt2"}.get(model.config.vocab_size)
        if tok_name is None:
            raise SystemExit(f"error: no tokenizer here for the model's vocabulary of {model.config.vocab_size} "
                             "tokens (byte: 257, gpt2: 50257)\nHINT: pass --tokenizer byte or gpt2 if the model was "
                             "trained with one, or work with token ids through the Python API (model.generate)")
    tok = get_tokenizer(tok_name)
    if tok.vocab_size > model.config.vocab_size:
        raise SystemExit(f"error: tokenizer {tok.name!r} has {tok.vocab_size} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size}\nHINT: pass --tokenizer matching the data the model was "
                         "trained on")
    try:
        model.to(device=device)
    except RuntimeError as exc:  # no cupy, or no such GPU
        raise SystemExit(f"error: --device {device}: {exc}") from None
    model.eval()
    return model, tok


def _from_checkpoint(path, dtype):
    """(model, tokenizer name) from a training checkpoint: only its model file is read, so a damaged optimizer file
    does not matter, and a run's out_dir falls back to its newest good checkpoint (warning about the others). A
    LoRA run's model is its pinned base with the adapters merged in, as plain layers."""
    model_state, state = load_model_checkpoint(path, warn=lambda message: print(f"warning: --checkpoint: {message}",
                                                                                 file=sys.stderr, flush=True))
    reference = state.get("lora")
    if reference:  # the seeded init the run started from, for a base that was not loaded from elsewhere
        it.manual_seed(reference["seed"])
    model = registry.build(state.get("arch", "gpt2"), state["model_config"])
    model.to(dtype=dtype)  # before loading: float64 weights stay exact in a float64 model
    if reference:
        from infini_train.models.pretrained import mapped_pretrained
        from infini_train.nn.lora import merge_and_unload
        from infini_train.run_state.lora_base import rebuild

        merge_and_unload(rebuild(model, reference, model_state, mapped_pretrained))
    else:
        model.load_state_dict(model_state)
    return model, state.get("tokenizer", "byte")


def split_over_ranks(model, tp_group):
    """Split ``model`` over the job's ranks (tensor parallelism); a shape the ranks cannot share is one message
    naming the rank count, since under generate.py / evaluate.py that is mpirun's -n."""
    from infini_train.models.registry import tensor_parallel
    from infini_train.models.tensor_parallel_lm import TensorParallelError

    try:
        tensor_parallel(model, tp_group)
    except TensorParallelError as exc:
        size = tp_group.size
        counts = _head_counts(model)
        fits = sorted({d for d in range(1, max(counts.values()) + 1) if all(c % d == 0 for c in counts.values())})
        raise SystemExit(once(f"error: mpirun -n {size}: the model cannot be split over {size} ranks ("
                         f"{str(exc).splitlines()[0]})\nHINT: start as many ranks as divide "
                         f"{' and '.join(f'{k} = {v}' for k, v in counts.items())}: mpirun -n "
                         f"{' | '.join(map(str, fits))}")) from None


def _head_counts(model):
    config = model.config  # query and key/value heads are split alike
    counts = {"n_head": config.num_heads, "n_kv_head": config.num_kv_heads}
    return counts if counts["n_kv_head"] != counts["n_head"] else {"n_head": config.num_heads}


def join_tensor_parallel(size, device):
    """Join the job's world (a world of one without mpirun) and split the model over ``size`` ranks (default:
    all of them). Returns (tensor-parallel group or None, this rank's device): ``--device cuda`` means
    cuda:<local rank> under mpirun, as in training."""
    from infini_train import distributed as dist
    from infini_train.distributed.mesh import ProcessMesh

    dist.init_process_group()
    world = dist.get_world_size()
    size = world if size is None else size
    if size != world:
        raise SystemExit(f"error: --tensor-parallel: expected the number of ranks ({world}), got {size}\nHINT: start "
                         f"as many ranks as tensor-parallel parts (mpirun -n {size}), or leave --tensor-parallel out")
    if world > 1 and str(device).strip() == "cuda":
        device = f"cuda:{dist.get_local_rank()}"
    if size == 1:
        return None, device
    return ProcessMesh(tensor=size).tensor_group, device


def _pretrained(path):
    """An HF directory (the model its config.json's model_type names) or an llm.c .bin file."""
    from infini_train.models.pretrained import from_pretrained

    return from_pretrained(path)


def to_tensor(tokens, device):
    return it.tensor(np.asarray(tokens, dtype=np.int64), device=device)
