"""``from_pretrained(path)``: any model this package knows from a Hugging Face directory, by config.json's
``model_type`` (gpt2, llama, qwen3, qwen3_moe, mixtral), or GPT-2 from an llm.c ``.bin`` file. Every model writes
the same layout back with ``save_pretrained(directory)``."""
from __future__ import annotations

import json
import os

from .gpt2.io import WeightsError
from .registry import model_class

HF_MODEL_TYPES = {"gpt2": "gpt2", "llama": "llama3", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral"}


def hf_model_class(model_type, source="config.json"):
    """The model class of an HF ``model_type``."""
    if model_type not in HF_MODEL_TYPES:
        raise WeightsError(f"{source}: model_type {model_type!r} is not supported; expected one of "
                           f"{sorted(HF_MODEL_TYPES)}")
    return model_class(HF_MODEL_TYPES[model_type])[0]


def read_config_json(directory, who="from_pretrained"):
    """(config.json of the HF directory ``directory`` as a dict, its path); a FileNotFoundError naming ``who`` when
    it is missing."""
    config_path = os.path.join(directory, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{who}: {config_path} is missing\nHINT: an HF model directory holds config.json and "
                                "model.safetensors (or shards and their index)")
    with open(config_path) as f:
        return json.load(f), config_path


def from_pretrained(path, device=None, dtype=None):
    """The model of an HF directory (config.json + safetensors, sharded or not) with its weights, the class chosen by
    config.json's ``model_type``; an llm.c ``.bin`` file is a GPT-2. ``dtype`` (LLaMA-like models): keep the weights
    in that dtype instead of float32."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"from_pretrained: no such file or directory: {path}\nHINT: pass an HF model "
                                    "directory (config.json + safetensors) or an llm.c .bin file")
        return model_class("gpt2")[0].from_pretrained(path, device=device)
    hf, config_path = read_config_json(path)
    model_type = hf.get("model_type")
    cls = hf_model_class(model_type, config_path)
    if model_type == "gpt2":
        model = cls.from_pretrained(path, device=device)
        return model.to(dtype=dtype) if dtype is not None else model
    return cls.from_pretrained(path, device=device, dtype=dtype)


def pretrained_config(path):
    """(arch, model config) of an HF directory (config.json's ``model_type``) or an llm.c ``.bin`` (GPT-2), reading
    only config.json or the file's header."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file or directory\nHINT: name an HF model directory "
                                    "(config.json + safetensors) or an llm.c .bin file")
        from .gpt2.io import llmc_weights

        return "gpt2", llmc_weights(path)[0]
    hf, config_path = read_config_json(path, "model.pretrained")
    model_type = hf.get("model_type")
    cls = hf_model_class(model_type, config_path)
    if model_type == "gpt2":
        from .gpt2.io import hf_config_to_gpt2

        return "gpt2", hf_config_to_gpt2(hf, config_path)
    return HF_MODEL_TYPES[model_type], cls.config_from_hf(hf, config_path)


def mapped_pretrained(path, model):
    """{name: tensor read box by box} of the weights at ``path`` for a model like ``model`` (its names): an HF
    directory (GPT-2 or LLaMA-like) or an llm.c ``.bin``; None for anything else (a training checkpoint). Nothing is
    read until a box is asked for."""
    from .gpt2 import io as gpt2_io
    from .llama import Llama
    from .llama import io as llama_io

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        return llama_io.hf_weights(path)[1] if isinstance(model, Llama) else gpt2_io.hf_weights(path)[1]
    if os.path.isfile(path) and path.endswith(".bin"):
        return gpt2_io.llmc_weights(path)[1]
    return None


__all__ = ["from_pretrained", "hf_model_class", "pretrained_config", "read_config_json", "mapped_pretrained",
           "HF_MODEL_TYPES"]
