"""A LoRA run's base weights, pinned by its checkpoints: the checkpoint holds the adapters and a reference to the
base, the source actually read (a run's out_dir resolves to the step directory it held then) and a SHA-256 of the
base's values. Rebuilding such a model (a resume, evaluation, generation, consolidation) reads that source again and
refuses weights whose digest differs, so adapters are never applied to another base than the one they were trained
on. Reading an HF directory or an llm.c file is the model's business: ``read_pretrained(path, model)`` comes in from
the caller (infini_train.models.pretrained.mapped_pretrained) and returns None for a training checkpoint.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from ..nn import lora as lora_lib
from ..progress import progress
from .directory import CheckpointError, resolve_checkpoint
from .reader import mapped_model_checkpoint

DIGEST_CHUNK = 1 << 20  # elements hashed at a time


class BaseWeightsError(ValueError):
    """Base weights that cannot be read or do not fit the model; the message starts with the config key."""


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


def streamed_digest(state, shapes, dtype):
    """weights_digest of the weights ``state`` ({name: tensor read box by box}) holds as ``dtype``, read a few rows
    at a time: memory is one chunk, whatever the model's size."""
    from ..mapped_arrays import read_box

    digest = hashlib.sha256()
    for name in progress(sorted(shapes), desc="hashing the base weights", unit="tensor"):
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


def resolve_base(init_from):
    """The file or directory ``init_from`` stands for: an HF directory or an llm.c .bin as given, a training run's
    out_dir as its newest checkpoint (absolute paths)."""
    path = os.path.abspath(init_from)
    if (os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))) or (
            os.path.isfile(path) and path.endswith(".bin")):
        return path
    try:
        return os.path.abspath(resolve_checkpoint(path))
    except CheckpointError as exc:
        raise BaseWeightsError(f"lora.init_from: {exc}") from None


def mapped_base(path, model, read_pretrained):
    """{name: tensor read box by box} of the base weights at ``path`` (resolve_base) for a model like ``model``:
    nothing is read until a box is asked for."""
    weights = read_pretrained(path, model)
    if weights is not None:
        return weights
    try:
        weights, state = mapped_model_checkpoint(path)
    except CheckpointError as exc:
        raise BaseWeightsError(f"lora.init_from: {exc}") from None
    if state.get("lora"):
        raise BaseWeightsError(f"lora.init_from: {path} is a LoRA run's checkpoint (adapters only)\nHINT: fine-tune "
                               "from its base, or merge its adapters first (generate.py loads it merged)")
    return weights


def check_fits(state, shapes, init_from, key="lora.init_from"):
    """BaseWeightsError unless ``state`` holds every name of ``shapes`` ({name: shape}) in that shape."""
    wrong = [f"{k}: base {tuple(state[k].shape)}, model {shape}" for k, shape in shapes.items()
             if k in state and tuple(state[k].shape) != shape]
    missing = [k for k in shapes if k not in state]
    if wrong or missing:
        raise BaseWeightsError(f"{key}: {init_from} does not fit the model the config builds ("
                               f"{'; '.join(wrong[:3] or [f'missing {missing[:3]}'])})\nHINT: set model.* (arch, "
                               "preset or the shape fields) to the base model's shape")


def load_base_weights(model, init_from, read_pretrained):
    """Copy the base weights at ``init_from`` into the whole (not yet split) ``model``: an HF directory (GPT-2 or
    LLaMA), an llm.c .bin file, or a training checkpoint (a step directory or a run's out_dir). Returns the source
    read (resolve_base)."""
    source = resolve_base(init_from)
    state = mapped_base(source, model, read_pretrained)
    own = model.state_dict()
    check_fits(state, {k: tuple(v.shape) for k, v in own.items()}, init_from)
    model.load_state_dict({k: np.asarray(state[k]) for k in own})
    return source


def base_source(init_from, reference):
    """The file or directory a LoRA run reads its base from: a resumed checkpoint's recorded source (``reference``),
    else ``init_from`` resolved; None for the seeded init."""
    if reference is None:
        return resolve_base(init_from) if init_from else None
    source = reference.get("base_source") or reference.get("base")
    if source and not os.path.exists(source):
        raise CheckpointError(
            f"the LoRA checkpoint's base weights {source} are gone\nHINT: put the base model back at that path "
            "(a base run's checkpoint may have been pruned by its train.keep_last)")
    return source or None


def checked_base(reference, source, found_digest):
    """The BaseWeights of a resumed LoRA checkpoint whose base was read from ``source``: ``found_digest()`` must
    give the digest the checkpoint recorded."""
    base = BaseWeights(reference.get("base"), source, reference.get("base_sha256"))
    if base.sha256 is not None:
        found = found_digest()
        if found != base.sha256:
            what = f"the base weights at {source}" if source else "the seeded initial weights"
            raise CheckpointError(
                f"{what} are not the ones the LoRA adapters were trained on (SHA-256 of their values: recorded "
                f"{base.sha256[:16]}..., found {found[:16]}...)\nHINT: the base was replaced or retrained after the "
                "fine-tune; put the original base back at that path, or fine-tune again from the new one")
    return base


def restore_base(model, reference, read_pretrained):
    """A LoRA checkpoint's base, loaded into ``model`` (which holds the seeded init the run started from) from the
    source the run read, and checked against the recorded digest (checkpoints written before digests were recorded
    load unchecked)."""
    source = base_source(None, reference)
    if source:
        try:
            load_base_weights(model, source, read_pretrained)
        except BaseWeightsError as exc:
            raise CheckpointError(f"the LoRA checkpoint's base weights could not be read: {exc}") from None
    return checked_base(reference, source, lambda: weights_digest(model))


def targets(target_modules):
    """lora.target_modules as apply_lora takes it: "all-linear", a regex string, or a list of names."""
    text = target_modules.strip()
    if text == "all-linear" or any(ch in text for ch in "*()[]|\\^$+?"):
        return text
    return [name.strip() for name in text.split(",") if name.strip()]


def rebuild(model, reference, adapters, read_pretrained):
    """A LoRA run's model from its checkpoint (``reference``: its ``lora`` record; ``adapters``: its model state):
    the base weights (restore_base; ``model`` holds the seeded init the run started from), then the adapters."""
    restore_base(model, reference, read_pretrained)
    try:
        lora_lib.apply_lora(model, reference["rank"], reference["alpha"], reference["dropout"],
                            targets(reference["target_modules"]))
    except lora_lib.LoRAError as exc:
        raise CheckpointError(f"lora.target_modules: {exc}") from None
    return lora_lib.load_lora_state_dict(model, adapters)


__all__ = ["BaseWeights", "BaseWeightsError", "weights_digest", "streamed_digest", "resolve_base", "mapped_base",
           "check_fits", "load_base_weights", "base_source", "checked_base", "restore_base", "targets", "rebuild"]
