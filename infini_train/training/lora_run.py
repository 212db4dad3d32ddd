"""LoRA fine-tuning in a run (the ``lora`` config section): the base weights come from ``lora.init_from``, adapters
wrap the target layers (after the tensor-parallel split, so they are split too), every base weight is frozen, and
checkpoints hold only the adapters (whole) plus a reference to the base. The same steps rebuild such a model from
its checkpoint for resuming, evaluation and generation.

The reference pins the base: the source actually read (a run's out_dir resolves to the step directory it held
then) and a SHA-256 of the base's values. Resuming, evaluating or generating reads that source again and refuses
weights whose digest differs, so adapters are never applied to another base than the one they were trained on.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from ..nn import lora as lora_lib
from . import checkpoints as ckpt
from .config import ConfigError

LORA_SETTINGS = ("rank", "alpha", "dropout", "target_modules")
DIGEST_CHUNK = 1 << 20  # elements hashed at a time


@dataclass
class BaseWeights:
    """Where a LoRA run's frozen base came from: ``init_from`` as configured (absolute; None: the seeded init),
    ``source`` the file or directory read (a checkpoint's step directory rather than an out_dir), and ``sha256`` the
    digest of its values (weights_digest)."""

    init_from: str = None
    source: str = None
    sha256: str = None


def weights_digest(model):
    """SHA-256 of ``model``'s state (names, shapes and values as float64, so a float32 copy and an exact float64
    copy of the same weights agree), in name order: what identifies a LoRA run's base."""
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        flat = value.numpy().reshape(-1)
        digest.update(f"{name}:{tuple(value.shape)};".encode())
        for start in range(0, flat.size, DIGEST_CHUNK):  # bounded extra memory, whatever the tensor's size
            digest.update(flat[start:start + DIGEST_CHUNK].astype(np.float64).tobytes())
    return digest.hexdigest()


def resolve_base(init_from):
    """The file or directory ``init_from`` stands for: an HF directory or an llm.c .bin as given, a training run's
    out_dir as its newest checkpoint (absolute paths)."""
    path = os.path.abspath(init_from)
    if (os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))) or (
            os.path.isfile(path) and path.endswith(".bin")):
        return path
    try:
        return os.path.abspath(ckpt.resolve_checkpoint(path))
    except ckpt.CheckpointError as exc:
        raise ConfigError(f"lora.init_from: {exc}") from None


def load_base_weights(model, init_from):
    """Copy the base weights at ``init_from`` into the whole (not yet split) ``model``: an HF directory (GPT-2 or
    LLaMA), an llm.c .bin file, or a training checkpoint (a step directory or a run's out_dir). Returns the source
    read (resolve_base)."""
    source = resolve_base(init_from)
    state = mapped_base(source, model)
    own = model.state_dict()
    _check_fits(state, {k: tuple(v.shape) for k, v in own.items()}, init_from)
    model.load_state_dict({k: np.asarray(state[k]) for k in own})
    return source


def _check_fits(state, shapes, init_from, key="lora.init_from"):
    wrong = [f"{k}: base {tuple(state[k].shape)}, model {shape}" for k, shape in shapes.items()
             if k in state and tuple(state[k].shape) != shape]
    missing = [k for k in shapes if k not in state]
    if wrong or missing:
        raise ConfigError(f"{key}: {init_from} does not fit the model the config builds ("
                          f"{'; '.join(wrong[:3] or [f'missing {missing[:3]}'])})\nHINT: set model.* (arch, preset or "
                          "the shape fields) to the base model's shape")


def mapped_base(path, model):
    """{name: tensor read box by box} of the base weights at ``path`` (resolve_base) for a model like ``model``:
    nothing is read until a box is asked for."""
    from ..models.pretrained import mapped_pretrained

    weights = mapped_pretrained(path, model)  # an HF directory or an llm.c file, read by the model's spec
    if weights is not None:
        return weights
    try:
        weights, state = ckpt.mapped_model_checkpoint(path)
    except ckpt.CheckpointError as exc:
        raise ConfigError(f"lora.init_from: {exc}") from None
    if state.get("lora"):
        raise ConfigError(f"lora.init_from: {path} is a LoRA run's checkpoint (adapters only)\nHINT: fine-tune from "
                          "its base, or merge its adapters first (generate.py loads it merged)")
    return weights


def base_source(lora_cfg, reference):
    """The file or directory a LoRA run reads its base from: a resumed checkpoint's recorded source, else
    ``lora.init_from`` resolved; None for the seeded init."""
    if reference is None:
        return resolve_base(lora_cfg.init_from) if lora_cfg.init_from else None
    source = reference.get("base_source") or reference.get("base")
    if source and not os.path.exists(source):
        raise ckpt.CheckpointError(
            f"the LoRA checkpoint's base weights {source} are gone\nHINT: put the base model back at that path "
            "(a base run's checkpoint may have been pruned by its train.keep_last)")
    return source or None


def prepare_base(model, init_from):
    """A new LoRA run's base: load ``init_from`` into ``model`` (None: keep its seeded init) and pin it."""
    source = load_base_weights(model, init_from) if init_from else None
    return BaseWeights(os.path.abspath(init_from) if init_from else None, source, weights_digest(model))


def restore_base(model, reference):
    """A LoRA checkpoint's base, loaded into ``model`` (which holds the seeded init the run started from) from the
    source the run read, and checked against the recorded digest (checkpoints written before digests were recorded
    load unchecked)."""
    source = base_source(None, reference)
    if source:
        try:
            load_base_weights(model, source)
        except ConfigError as exc:
            raise ckpt.CheckpointError(f"the LoRA checkpoint's base weights could not be read: {exc}") from None
    return checked_base(reference, source, lambda: weights_digest(model))


def checked_base(reference, source, found_digest):
    """The BaseWeights of a resumed LoRA checkpoint whose base was read from ``source``: ``found_digest()`` must
    give the digest the checkpoint recorded."""
    base = BaseWeights(reference.get("base"), source, reference.get("base_sha256"))
    if base.sha256 is not None:
        found = found_digest()
        if found != base.sha256:
            what = f"the base weights at {source}" if source else "the seeded initial weights"
            raise ckpt.CheckpointError(
                f"{what} are not the ones the LoRA adapters were trained on (SHA-256 of their values: recorded "
                f"{base.sha256[:16]}..., found {found[:16]}...)\nHINT: the base was replaced or retrained after the "
                "fine-tune; put the original base back at that path, or fine-tune again from the new one")
    return base


def load_base_pieces(model, source, like, shapes, tp_rank=0, tp_size=1):
    """Fill the base weights ``model`` holds on this rank (built on the meta device, then split, staged, sharded and
    given storage, adapters applied) from ``source``, reading only the boxes this rank keeps. ``like``: a model of
    the run's class; ``shapes``: the whole base model's {name: shape}. Returns the base's digest (weights_digest's,
    streamed tensor by tensor on rank 0 and shared with every rank)."""
    from .. import distributed as dist

    state = mapped_base(source, like)
    _check_fits(state, shapes, source)
    dtype = fill_base_pieces(model, state, tp_rank, tp_size)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, streamed_digest(state, shapes, dtype) if dist.get_rank() == 0 else None)
    return found[0]


def load_pretrained_pieces(model, path, like, shapes, tp_rank=0, tp_size=1):
    """Fill every weight ``model`` holds on this rank (built on the meta device, split, staged, sharded and given
    storage) from the pretrained model at ``path`` (model.pretrained), reading only this rank's boxes: full
    fine-tuning's start. ``like`` and ``shapes`` as load_base_pieces."""
    state = mapped_base(os.path.abspath(path), like)
    _check_fits(state, shapes, path, key="model.pretrained")
    fill_base_pieces(model, state, tp_rank, tp_size)


def base_entries(model):
    """(base weight's name in the base model, tensor) of each state-dict entry of ``model`` but the adapters."""
    for key, t in model.state_dict(keep_vars=True).items():
        if ".lora_A." not in key and ".lora_B." not in key:
            yield key.replace(".base_layer.", "."), t


def fill_base_pieces(model, state, tp_rank=0, tp_size=1):
    """Copy into each base tensor of ``model`` the boxes of ``state``'s whole tensors it holds on this rank (its
    tensor-parallel shard, or its ZeRO-3 flat piece of that); returns the base's dtype."""
    from .. import backend
    from ..mapped_arrays import read_box
    from ..nn.parallel.sharded_pieces import param_pieces

    dtype = None
    for name, t in base_entries(model):
        if dtype is None:
            dtype = getattr(t, "sharded_by", t).dtype
        for offsets, view in param_pieces(t, tp_rank, tp_size).pieces:
            box = read_box(state[name], offsets, view.shape).astype(view.dtype)
            view[...] = backend.to_device_array(box, backend.device_of_array(view))
        t._version[0] += 1
    return dtype


def streamed_digest(state, shapes, dtype):
    """weights_digest of the weights ``state`` ({name: tensor read box by box}) holds as ``dtype``, read a few rows
    at a time: memory is one chunk, whatever the model's size."""
    from ..mapped_arrays import read_box

    digest = hashlib.sha256()
    for name in sorted(shapes):
        shape = shapes[name]
        digest.update(f"{name}:{shape};".encode())
        if not shape:
            digest.update(np.asarray(state[name][...]).astype(dtype).astype(np.float64).tobytes())
            continue
        row = int(np.prod(shape[1:], dtype=np.int64)) or 1
        step = max(1, DIGEST_CHUNK // row)
        for start in range(0, shape[0], step):
            rows = read_box(state[name], (start,) + (0,) * (len(shape) - 1),
                            (min(step, shape[0] - start),) + tuple(shape[1:]))
            digest.update(rows.astype(dtype).astype(np.float64).reshape(-1).tobytes())
    return digest.hexdigest()


def check_same_lora(reference, lora_cfg, path):
    """A resumed run must configure the LoRA its checkpoint was trained with (or none, for a full checkpoint)."""
    run_config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "config.yaml")
    hint = f"\nHINT: resume with the run's own config ({run_config}), or start a new run in another out_dir"
    if not reference:
        if lora_cfg.rank:
            raise ConfigError(f"resume: checkpoint {path} holds a whole model (no LoRA adapters), but the config sets "
                              f"lora.rank={lora_cfg.rank}{hint}")
        return
    if not lora_cfg.rank:
        raise ConfigError(f"resume: checkpoint {path} is a LoRA run's (rank {reference['rank']}, base "
                          f"{reference.get('base') or 'the seeded init'}), but the config has no lora section "
                          f"(lora.rank=0){hint}")
    differ = [f"lora.{k}: checkpoint {reference[k]!r}, config {getattr(lora_cfg, k)!r}" for k in LORA_SETTINGS
              if reference.get(k) != getattr(lora_cfg, k)]
    configured = os.path.abspath(lora_cfg.init_from) if lora_cfg.init_from else None
    if configured != reference.get("base"):
        differ.append(f"lora.init_from: checkpoint {reference.get('base')!r}, config {configured!r}")
    if differ:
        raise ConfigError(f"resume: checkpoint {path} was trained with other LoRA settings ({'; '.join(differ)})"
                          f"{hint}")


def apply_run_lora(model, lora_cfg):
    """Wrap the target layers of ``model`` with adapters (seeded: the same on every rank) and freeze the rest."""
    try:
        return lora_lib.apply_lora(model, lora_cfg.rank, lora_cfg.alpha, lora_cfg.dropout, lora_cfg.targets())
    except lora_lib.LoRAError as exc:
        raise ConfigError(f"lora.target_modules: {exc}") from None


def checkpoint_reference(lora_cfg, seed, base):
    """What a LoRA run's checkpoint records to rebuild its base (``base``: BaseWeights) and adapters."""
    return {"rank": lora_cfg.rank, "alpha": lora_cfg.alpha, "dropout": lora_cfg.dropout,
            "target_modules": lora_cfg.target_modules, "base": base.init_from, "base_source": base.source,
            "base_sha256": base.sha256, "seed": seed}


def rebuild(model, reference, adapters):
    """A LoRA run's model from its checkpoint: the base weights (restore_base; ``model`` holds the seeded init the
    run started from), then the adapters."""
    from .config import LoraConfig

    restore_base(model, reference)
    settings = LoraConfig(rank=reference["rank"], alpha=reference["alpha"], dropout=reference["dropout"],
                          target_modules=reference["target_modules"])
    apply_run_lora(model, settings)
    return lora_lib.load_lora_state_dict(model, adapters)


__all__ = ["BaseWeights", "weights_digest", "resolve_base", "load_base_weights", "prepare_base", "restore_base",
           "base_source", "checked_base", "load_base_pieces", "load_pretrained_pieces", "fill_base_pieces",
           "base_entries", "streamed_digest", "mapped_base", "check_same_lora", "apply_run_lora",
           "checkpoint_reference", "rebuild"]
