"""What a run prints before its first step, on rank 0 only, after the messages of its set-up (the default corpus
built, SFT data read). For example (configs/gpt2_tiny.yaml, whose batch_size 16 the command line sets back to the
default 8, so that key is not listed):

    mpirun -n 2 python examples/gpt2/train.py out_dir=/tmp/st_z1 train.learning_rate=3e-4 train.batch_size=8 \
        parallel.zero_stage=1 train.num_iterations=2 train.val_loss_every=0 train.sample_every=0

    config: 19 settings differ from the defaults (all of them in /tmp/st_z1/config.yaml)
      out_dir: /tmp/st_z1 (default runs/default)
      model.block_size: 64
      ...
      train.learning_rate: 0.0003 (default 0.001)
      ...
      parallel.zero_stage: 1 (default 0)
    world 2 = DP2, ZeRO-1, fp32, cpu (mpi, MPICH 5.0.2)
    parameters: 3,241,728 (all trainable)
    data: 3,799,233 train tokens, no validation (tokenizer byte)
    batch: 1,024 tokens/step = B8 x T64 x grad_accum 1 x DP2; 2 steps = 0.000539 epochs
    MFU against ...

- **config**: only the settings whose value is not the default (``model.*`` keys whose default is null -- the
  preset's or the arch's value -- show no default). ``--print-config`` prints the whole resolved config, and
  out_dir/config.yaml holds it (config.resume-<step>.yaml on a resume).
- **world**: the layout (layout_summary): the world size as the product of its axes larger than 1 -- PP (its schedule
  and virtual stages), DP (EP: the experts split over the data ranks), CP, TP (+SP) -- then the ZeRO stage, the
  precision, the device kind and, with several ranks, the process-group backend and the MPI library.
- **parameters**: the whole model's (not a rank's), the trainable ones where some are frozen (LoRA), and, where the
  layout splits them (TP, PP, EP, ZeRO-3), the parameter values each rank holds.
- **data**: tokens of the train and val shards, or the SFT examples used (their tokens and trained tokens per epoch);
  **batch**: the tokens of an optimizer step, and how many epochs the run's steps cover.
"""
from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..data.sft_loader import SFTDataLoader
from ..distributed.launch_utils import mpi_library
from ..tensor import Tensor


def _shown(value):
    """A setting's value as YAML writes it: null, true / false, text as it is ('' for the empty text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value and value.strip() == value else repr(value)
    return str(value)


def config_lines(cfg, path):
    """The config's settings that differ from the defaults, one ``dotted.key: value (default d)`` line each, under a
    header naming ``path``, the file holding the whole resolved config."""
    changed = cfg.differences()
    count = "1 setting differs" if len(changed) == 1 else f"{len(changed)} settings differ"
    lines = [f"config: {count} from the defaults (all of them in {path})"]
    for key, value, default in changed:
        lines.append(f"  {key}: {_shown(value)}" + (f" (default {_shown(default)})" if default is not None else ""))
    return lines


def layout_summary(dims, cfg, device, transport=None):
    """``world 8 = PP2 (1f1b) x DP2 x TP2+SP, ZeRO-1, bf16-mixed, cuda (nccl, MPICH 5.0.2)``: the world of ``dims``
    (a ParallelDims) as its axes larger than 1, slowest first as ranks are laid out (context parallelism with its
    method: ``CP4 (ulysses)``, ``CP4 (hybrid: all-to-all 2 x ring 2)``); the ZeRO stage and precision of
    ``cfg``; the kind of ``device``; ``transport``: the backend and MPI library (several ranks)."""
    axes = []
    if dims.pp_size > 1:
        virtual = f", {dims.virtual} virtual stages" if dims.virtual > 1 else ""
        axes.append(f"PP{dims.pp_size} ({dims.schedule}{virtual})")
    if dims.dp_size > 1:
        axes.append(f"DP{dims.dp_size}")
    if dims.cp_size > 1:
        axes.append(f"CP{dims.cp_size} ({dims.context_layout})")
    if dims.expert_size > 1:  # the experts split over groups of the data (x context) ranks
        ep = f"EP{dims.expert_size}"
        axes[-1] = axes[-1][:-1] + f", {ep})" if axes[-1].endswith(")") else axes[-1] + f" ({ep})"
    if dims.tp_size > 1:
        axes.append(f"TP{dims.tp_size}" + ("+SP" if dims.sequence_parallel else ""))
    parts = [f"world {dims.world} = {' x '.join(axes)}" if axes else f"world {dims.world} (one process)"]
    if cfg.parallel.zero_stage:
        parts.append(f"ZeRO-{cfg.parallel.zero_stage}")
    parts.append("fp64" if cfg.dtype == "float64" else cfg.precision)
    parts.append(device.type)
    return ", ".join(parts) + (f" ({transport})" if transport else "")


def transport(world):
    """``mpi, MPICH 5.0.2``: the process-group backend and the MPI library that carries the job (or bootstraps
    NCCL); None in one process."""
    if world == 1:
        return None
    library = mpi_library()
    return f"{dist.get_backend()}, {library}" if library else dist.get_backend()


def is_sharded(dims, zero_stage):
    """Whether the layout splits the parameters over ranks (so a rank holds fewer than the model has)."""
    return dims.tp_size > 1 or dims.pp_size > 1 or dims.expert_size > 1 or zero_stage == 3


def held_per_rank(held, world):
    """Every rank's ``held`` (an int), gathered: a collective, every rank calls it."""
    parts = [Tensor(np.zeros(1, np.int64)) for _ in range(world)]
    dist.all_gather(parts, Tensor(np.array([held], np.int64)))
    return [int(p.numpy()[0]) for p in parts]


def parameters_per_rank(layout):
    """The parameter values each rank of ``layout`` (a TrainingLayout) holds, where the layout splits them; else
    None. A collective in that case: every rank calls it."""
    if layout.dims.world == 1 or not is_sharded(layout.dims, layout.zero_stage):
        return None
    return held_per_rank(layout.parameter_count(), layout.dims.world)


def parameter_summary(total, trainable, per_rank=None):
    """``parameters: 124,439,808, 294,912 trainable (0.24%); per rank 31,122,432 to 31,159,296``."""
    line = f"parameters: {total:,}"
    line += " (all trainable)" if trainable == total else f", {trainable:,} trainable ({100 * trainable / total:.2f}%)"
    if per_rank:
        low, high = min(per_rank), max(per_rank)
        line += f"; per rank {low:,}" + (f" to {high:,}" if high != low else "")
    return line


def _epochs(value):
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def data_summary(cfg, dp_size, grad_accum, tokenizer, train_loader, val_loader=None):
    """Two lines: ``data: N train tokens, M val tokens (tokenizer byte)`` (SFT data: the examples used, their tokens
    and trained tokens per epoch) and ``batch: 1,024 tokens/step = B16 x T64 x grad_accum 1 x DP1; 300 steps = 0.0809
    epochs``."""
    t = cfg.train
    per_step = t.batch_size * t.sequence_length * grad_accum * dp_size
    if isinstance(train_loader, SFTDataLoader):  # SFT samples: an epoch is the rows they are laid out in
        s = train_loader.stats()
        what = (f"{s['used']:,} train examples ({cfg.data.format}): {s['tokens']:,} tokens, {s['trained']:,} "
                f"trained per epoch")
        what += f"; {val_loader.stats()['used']:,} val examples" if val_loader is not None else "; no validation"
        epochs = t.num_iterations * t.batch_size * grad_accum * dp_size / s["rows"]
    else:
        tokens = train_loader.num_tokens()
        what = f"{tokens:,} train tokens, " + (f"{val_loader.num_tokens():,} val tokens" if val_loader
                                                else "no validation")
        epochs = t.num_iterations * per_step / tokens
    return [f"data: {what} (tokenizer {tokenizer})",
            f"batch: {per_step:,} tokens/step = B{t.batch_size} x T{t.sequence_length} x grad_accum {grad_accum} x "
            f"DP{dp_size}; {t.num_iterations} steps = {_epochs(epochs)} epochs"]


__all__ = ["config_lines", "layout_summary", "parameter_summary", "data_summary", "held_per_rank", "is_sharded",
           "parameters_per_rank", "transport"]
