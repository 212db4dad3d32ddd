"""PEFT's LoRA adapter files: ``adapter_config.json`` (LoraConfig's fields, as peft 0.21.2 writes them) and
``adapter_model.safetensors`` (``base_model.model.<module path>.lora_A.weight`` / ``.lora_B.weight``: the model's
own state-dict names behind PEFT's prefix; one adapter, so no adapter name in the keys).

Only plain LoRA is read: a config asking for DoRA, trained biases, per-layer ranks or other variants is refused by
name rather than loaded into something else.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..atomic_file import write_text_atomically

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."

# Every field peft 0.21.2's LoraConfig.save_pretrained writes, at its default (peft fills in peft_version itself).
PEFT_LORA_DEFAULTS = {
    "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None, "auto_mapping": None,
    "base_model_name_or_path": None, "bias": "none", "corda_config": None, "ensure_weight_tying": False,
    "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True,
    "init_lora_weights": True, "kasa_config": None, "layer_replication": None, "layers_pattern": None,
    "layers_to_transform": None, "loftq_config": {}, "lora_alpha": 8, "lora_bias": False, "lora_dropout": 0.0,
    "lora_ga_config": None, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
    "monteclora_config": None, "peft_type": "LORA", "qalora_group_size": 16, "r": 8, "rank_pattern": {},
    "revision": None, "target_modules": None, "target_parameters": None, "task_type": "CAUSAL_LM",
    "trainable_token_indices": None, "use_bdlora": None, "use_dora": False, "use_qalora": False,
    "use_rslora": False, "velora_config": None,
}
# Fields the model's adapters decide; config_extra may not change them.
DERIVED = ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "use_rslora", "exclude_modules")
# Fields naming features beyond plain LoRA: loading is refused unless each is off (None, False, "none", {} or []).
UNSUPPORTED = {
    "use_dora": "DoRA", "bias": "trained base biases", "lora_bias": "LoRA biases", "modules_to_save": "fully "
    "trained modules", "rank_pattern": "per-layer ranks", "alpha_pattern": "per-layer alphas",
    "layers_to_transform": "a subset of layers", "layer_replication": "layer replication", "target_parameters":
    "parameter targets", "trainable_token_indices": "trainable tokens", "use_qalora": "QA-LoRA", "use_bdlora":
    "block-diagonal LoRA", "alora_invocation_tokens": "activated LoRA", "arrow_config": "Arrow routing",
    "velora_config": "VeLoRA", "monteclora_config": "MonteCLoRA", "kasa_config": "KaSA",
}


class LoRAError(ValueError):
    """A LoRA request that cannot be met: says what was expected, what was found, and a hint."""


@dataclass
class LoRASettings:
    """What ``apply_lora`` was asked for: PEFT's LoraConfig fields that shape the adapters."""

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: object  # a sorted list of module names, or a regex string
    use_rslora: bool = False
    exclude_modules: object = None


def adapter_config(settings, fan_in_fan_out=False, base_model_name_or_path=None, config_extra=None):
    """adapter_config.json's content for ``settings``; ``config_extra`` sets other LoraConfig fields."""
    config = dict(PEFT_LORA_DEFAULTS)
    config.update(r=settings.r, lora_alpha=settings.lora_alpha, lora_dropout=settings.lora_dropout,
                  target_modules=_json_targets(settings.target_modules), use_rslora=settings.use_rslora,
                  exclude_modules=_json_targets(settings.exclude_modules), fan_in_fan_out=bool(fan_in_fan_out),
                  base_model_name_or_path=base_model_name_or_path)
    extra = dict(config_extra or {})
    fixed = sorted(k for k in extra if k in DERIVED and extra[k] != config[k])
    if fixed:
        raise LoRAError(f"save_adapter: config_extra may not change {fixed} (the model's adapters decide them)\n"
                        "HINT: pass them to apply_lora instead")
    config.update(extra)
    return config


def _json_targets(targets):
    return targets if targets is None or isinstance(targets, str) else sorted(targets)


def write_adapter_files(directory, config, tensors):
    """Write the weights, then the config, each into a temporary file renamed into place."""
    from ..safetensors_io import write_safetensors

    os.makedirs(directory, exist_ok=True)
    write_safetensors(os.path.join(directory, WEIGHTS_FILE), dict(sorted(tensors.items())), {"format": "pt"})
    write_text_atomically(os.path.join(directory, CONFIG_FILE), json.dumps(config, indent=2, sort_keys=True) + "\n")


def to_peft_keys(state):
    """{``base_model.model.`` + name: tensor} of a whole adapter state dict."""
    return {PEFT_PREFIX + k: v for k, v in state.items()}


def from_peft_keys(tensors, directory):
    """The model's names for PEFT's keys (the prefix dropped)."""
    foreign = [k for k in tensors if not k.startswith(PEFT_PREFIX)]
    if foreign:
        raise LoRAError(f"load_adapter: {os.path.join(directory, WEIGHTS_FILE)}: expected keys starting with "
                        f"{PEFT_PREFIX!r}, got {foreign[:4]}\nHINT: is this a PEFT adapter file (save_pretrained of "
                        "a PeftModel)?")
    return {k[len(PEFT_PREFIX):]: v for k, v in tensors.items()}


def read_adapter_weights(directory):
    from ..safetensors_io import SafetensorsError, read_safetensors

    path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.exists(path):
        pickled = os.path.exists(os.path.join(directory, "adapter_model.bin"))
        hint = ("it holds adapter_model.bin, a pickle, which is never read here; re-save it with PEFT's "
                "save_pretrained(..., safe_serialization=True)") if pickled else "save_adapter writes it"
        raise FileNotFoundError(f"load_adapter: {path} is missing\nHINT: {hint}")
    try:
        return read_safetensors(path)
    except (SafetensorsError, OSError) as exc:
        raise LoRAError(f"load_adapter: not a readable adapter file: {exc}") from exc


def read_adapter_config(directory):
    """The LoRASettings of ``directory``'s adapter_config.json, after refusing what plain LoRA cannot load."""
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_adapter: {path} is missing\nHINT: pass a directory written by save_adapter "
                                "or PEFT's save_pretrained")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise LoRAError(f"load_adapter: {path}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        got = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise LoRAError(f"load_adapter: {path}: expected peft_type 'LORA', got {got!r}\nHINT: only LoRA adapters "
                        "are read")
    used = [f"{key}={config[key]!r} ({what})" for key, what in UNSUPPORTED.items()
            if config.get(key) not in (None, False, "none", {}, [])]
    if used:
        raise LoRAError(f"load_adapter: {path}: expected plain LoRA, but the config asks for " + "; ".join(used) +
                        "\nHINT: merge such an adapter into the base weights with PEFT (merge_and_unload) and load "
                        "the merged model instead")
    targets = config.get("target_modules")
    if not targets or not isinstance(targets, (str, list)):
        raise LoRAError(f"load_adapter: {path}: expected target_modules as a list of module names or a regex, got "
                        f"{targets!r}\nHINT: PEFT fills in a model type's defaults when it is null; write them out")
    return LoRASettings(int(config.get("r", 8)), config.get("lora_alpha", 8), float(config.get("lora_dropout", 0.0)),
                        targets if isinstance(targets, str) else sorted(targets), bool(config.get("use_rslora")),
                        config.get("exclude_modules"))


__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "PEFT_PREFIX", "PEFT_LORA_DEFAULTS", "LoRAError", "LoRASettings",
           "adapter_config", "write_adapter_files", "to_peft_keys", "from_peft_keys", "read_adapter_weights",
           "read_adapter_config"]
