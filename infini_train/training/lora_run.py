"""LoRA fine-tuning in a run (the ``lora`` config section): the base weights come from ``lora.init_from``, adapters
wrap the target layers (after the tensor-parallel split, so they are split too), every base weight is frozen, and
checkpoints hold only the adapters (whole) plus a reference to the base. The same steps rebuild such a model from
its checkpoint for resuming, evaluation and generation.
"""
from __future__ import annotations

import os

from ..nn import lora as lora_lib
from ..utils import checkpoint as ckpt
from ..utils.config import ConfigError


def load_base_weights(model, init_from):
    """Copy the base weights at ``init_from`` into the whole (not yet split) ``model``: an HF directory (GPT-2 or
    LLaMA), an llm.c .bin file, or a training checkpoint (a step directory or a run's out_dir)."""
    state = _base_state(init_from, model)
    own = model.state_dict()
    wrong = [f"{k}: base {tuple(state[k].shape)}, model {tuple(v.shape)}" for k, v in own.items()
             if k in state and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state]
    if wrong or missing:
        raise ConfigError(f"lora.init_from: {init_from} does not fit the model the config builds ("
                          f"{'; '.join(wrong[:3] or [f'missing {missing[:3]}'])})\nHINT: set model.* (arch, preset or "
                          "the shape fields) to the base model's shape")
    model.load_state_dict({k: state[k] for k in own})
    return model


def _base_state(path, model):
    from ..models.gpt2 import GPT2
    from ..models.llama import Llama

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        cls = Llama if isinstance(model, Llama) else GPT2
        return cls.from_pretrained(path).state_dict()
    if os.path.isfile(path) and path.endswith(".bin"):
        return GPT2.from_pretrained(path).state_dict()
    try:
        weights, _, state = ckpt.load_checkpoint(ckpt.resolve_checkpoint(path))
    except ckpt.CheckpointError as exc:
        raise ConfigError(f"lora.init_from: {exc}") from None
    if state.get("lora"):
        raise ConfigError(f"lora.init_from: {path} is a LoRA run's checkpoint (adapters only)\nHINT: fine-tune from "
                          "its base, or merge its adapters first (generate.py loads it merged)")
    return weights


def apply_run_lora(model, lora_cfg):
    """Wrap the target layers of ``model`` with adapters (seeded: the same on every rank) and freeze the rest."""
    try:
        return lora_lib.apply_lora(model, lora_cfg.rank, lora_cfg.alpha, lora_cfg.dropout, lora_cfg.targets())
    except lora_lib.LoRAError as exc:
        raise ConfigError(f"lora.target_modules: {exc}") from None


def checkpoint_reference(lora_cfg, seed):
    """What a LoRA run's checkpoint records to rebuild its base and adapters."""
    base = os.path.abspath(lora_cfg.init_from) if lora_cfg.init_from else None
    return {"rank": lora_cfg.rank, "alpha": lora_cfg.alpha, "dropout": lora_cfg.dropout,
            "target_modules": lora_cfg.target_modules, "base": base, "seed": seed}


def rebuild(model, reference, adapters):
    """A LoRA run's model from its checkpoint: the base weights (``reference["base"]``, or the seeded init the run
    started from, which ``model`` already holds), then the adapters."""
    from ..utils.config import LoraConfig

    if reference.get("base"):
        if not os.path.exists(reference["base"]):
            raise ckpt.CheckpointError(f"the LoRA checkpoint's base weights {reference['base']} are gone\nHINT: "
                                       "put the base model back at that path")
        load_base_weights(model, reference["base"])
    settings = LoraConfig(rank=reference["rank"], alpha=reference["alpha"], dropout=reference["dropout"],
                          target_modules=reference["target_modules"])
    apply_run_lora(model, settings)
    return lora_lib.load_lora_state_dict(model, adapters)


__all__ = ["load_base_weights", "apply_run_lora", "checkpoint_reference", "rebuild"]
