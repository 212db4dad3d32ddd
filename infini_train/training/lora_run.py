"""LoRA fine-tuning in a run (the ``lora`` config section): the base weights come from ``lora.init_from``, adapters
wrap the target layers (after the tensor-parallel split, so they are split too), every base weight is frozen, and
checkpoints hold only the adapters (whole) plus a reference to the base, which pins it (infini_train.run_state's
lora_base: the source read and a digest of its values; a resume, evaluation or generation refuses another base).
This module reads the base for a run, each rank only the boxes it keeps, with the run's config errors.
"""
from __future__ import annotations

import contextlib
import os

from ..models.pretrained import mapped_pretrained
from ..nn import lora as lora_lib
from ..run_state import lora_base
from ..run_state.lora_base import BaseWeights, checked_base, streamed_digest, weights_digest  # noqa: F401 (the loop's)
from .config import ConfigError

LORA_SETTINGS = ("rank", "alpha", "dropout", "target_modules")


@contextlib.contextmanager
def config_errors():
    """Base weights that cannot be read or do not fit: a ConfigError naming the key (the run's config errors)."""
    try:
        yield
    except lora_base.BaseWeightsError as exc:
        raise ConfigError(str(exc)) from None


def base_source(lora_cfg, reference):
    """The file or directory a LoRA run reads its base from: a resumed checkpoint's recorded source, else
    ``lora.init_from`` resolved; None for the seeded init."""
    with config_errors():
        return lora_base.base_source(lora_cfg.init_from, reference)


def prepare_base(model, init_from):
    """A new LoRA run's base: load ``init_from`` into ``model`` (None: keep its seeded init) and pin it."""
    with config_errors():
        source = lora_base.load_base_weights(model, init_from, mapped_pretrained) if init_from else None
    return BaseWeights(os.path.abspath(init_from) if init_from else None, source, weights_digest(model))


def restore_base(model, reference):
    """A LoRA checkpoint's base, loaded into ``model`` from the source the run read and checked against the recorded
    digest (lora_base.restore_base)."""
    return lora_base.restore_base(model, reference, mapped_pretrained)


def load_base_pieces(model, source, like, shapes, tp_rank=0, tp_size=1):
    """Fill the base weights ``model`` holds on this rank (built on the meta device, then split, staged, sharded and
    given storage, adapters applied) from ``source``, reading only the boxes this rank keeps. ``like``: a model of
    the run's class; ``shapes``: the whole base model's {name: shape}. Returns the base's digest (weights_digest's,
    streamed tensor by tensor on rank 0 and shared with every rank)."""
    from .. import distributed as dist

    with config_errors():
        state = lora_base.mapped_base(source, like, mapped_pretrained)
        lora_base.check_fits(state, shapes, source)
    dtype = fill_base_pieces(model, state, tp_rank, tp_size)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, streamed_digest(state, shapes, dtype) if dist.get_rank() == 0 else None)
    return found[0]


def load_pretrained_pieces(model, path, like, shapes, tp_rank=0, tp_size=1):
    """Fill every weight ``model`` holds on this rank (built on the meta device, split, staged, sharded and given
    storage) from the pretrained model at ``path`` (model.pretrained), reading only this rank's boxes: full
    fine-tuning's start. ``like`` and ``shapes`` as load_base_pieces."""
    with config_errors():
        state = lora_base.mapped_base(os.path.abspath(path), like, mapped_pretrained)
        lora_base.check_fits(state, shapes, path, key="model.pretrained")
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

    from ..progress import progress

    dtype = None
    entries = list(base_entries(model))
    for name, t in progress(entries, desc="loading pretrained weights", unit="tensor"):
        if dtype is None:
            dtype = (t.placement.flat_shard or t).dtype
        for offsets, view in param_pieces(t, tp_rank, tp_size).pieces:
            box = read_box(state[name], offsets, view.shape).astype(view.dtype)
            view[...] = backend.to_device_array(box, backend.device_of_array(view))
        t._version[0] += 1
    return dtype


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


__all__ = ["prepare_base", "restore_base", "base_source", "load_base_pieces", "load_pretrained_pieces",
           "fill_base_pieces", "base_entries", "check_same_lora", "apply_run_lora", "checkpoint_reference",
           "config_errors"]
