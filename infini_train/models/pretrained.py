"""``from_pretrained(path)``: any model this package knows from a Hugging Face directory, by config.json's
``model_type`` (each arch's ModelSection names its own), or from an llm.c ``.bin`` file (the arch whose section reads
llm.c files: GPT-2). Every model writes the same layout back with ``save_pretrained(directory)``. Which reader maps a
checkpoint's weights is the arch's ModelSpec's (``read_hf``, ``read_llmc``), never the model's class tested here."""
from __future__ import annotations

import json
import os

from .gpt2.io import WeightsError
from .registry import model_spec, sections, spec_of


def hf_model_types():
    """{config.json model_type: arch} of every registered arch."""
    return {s.hf_model_type: s.arch for s in sections() if s.hf_model_type}


def llmc_arch():
    """The arch whose weights llm.c model files hold."""
    return next(s.arch for s in sections() if s.llmc)


def _hf_arch(model_type, source):
    types = hf_model_types()
    if model_type not in types:
        raise WeightsError(f"{source}: model_type {model_type!r} is not supported; expected one of {sorted(types)}")
    return types[model_type]


def hf_model_class(model_type, source="config.json"):
    """The model class of an HF ``model_type``."""
    return model_spec(_hf_arch(model_type, source)).model_class


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
    config.json's ``model_type``; an llm.c ``.bin`` file is a GPT-2. ``dtype`` (HF directories): the weights in that
    dtype instead of float32."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"from_pretrained: no such file or directory: {path}\nHINT: pass an HF model "
                                    "directory (config.json + safetensors) or an llm.c .bin file")
        return model_spec(llmc_arch()).model_class.from_pretrained(path, device=device)
    hf, config_path = read_config_json(path)
    return hf_model_class(hf.get("model_type"), config_path).from_pretrained(path, device=device, dtype=dtype)


def pretrained_config(path):
    """(arch, model config) of an HF directory (config.json's ``model_type``) or an llm.c ``.bin``, reading only
    config.json or the file's header."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file or directory\nHINT: name an HF model directory "
                                    "(config.json + safetensors) or an llm.c .bin file")
        arch = llmc_arch()
        return arch, model_spec(arch).read_llmc(path)[0]
    hf, config_path = read_config_json(path, "model.pretrained")
    arch = _hf_arch(hf.get("model_type"), config_path)
    return arch, model_spec(arch).model_class.config_from_hf(hf, config_path)


def mapped_pretrained(path, model):
    """{name: tensor read box by box} of the weights at ``path`` for a model like ``model`` (its names): an HF
    directory, read by the model's spec, or an llm.c ``.bin`` (whose weights are llmc_arch()'s, so a model of another
    arch does not fit them); None for anything else (a training checkpoint). Nothing is read until a box is asked
    for."""
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")):
        spec = spec_of(model)
        if spec.read_hf is None:
            raise WeightsError(f"{path}: model.arch={spec.arch} reads no Hugging Face directories")
        return spec.read_hf(path)[1]
    if os.path.isfile(path) and path.endswith(".bin"):
        return model_spec(llmc_arch()).read_llmc(path)[1]
    return None


__all__ = ["from_pretrained", "hf_model_class", "hf_model_types", "llmc_arch", "pretrained_config",
           "read_config_json", "mapped_pretrained"]
