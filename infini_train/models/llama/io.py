"""LLaMA weights in the Hugging Face layout: config.json (transformers 5's ``rope_parameters``, or the older
``rope_theta`` + ``rope_scaling``) and model.safetensors, or shards listed by model.safetensors.index.json.
Module names are HF's, so tensors load by name; a tied output layer is not stored (HF omits lm_head.weight)."""
from __future__ import annotations

import json
import os
import re

import numpy as np

from ... import backend
from ...progress import progress
from ...safetensors_io import SafetensorsError, mapped_safetensors, write_safetensors
from ..gpt2.io import WeightsError, _atomic_write
from ..special_tokens import text_boundary_ids
from .config import ROPE_SCALING_KEYS, LlamaConfig

INDEX = "model.safetensors.index.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def hf_config_to_llama(hf, source):
    """Our LlamaConfig from an HF config.json dict."""
    return LlamaConfig(**llama_config_fields(hf, source, "llama"))


def llama_config_fields(hf, source, model_type):
    """The LlamaConfig fields of an HF config.json dict of ``model_type`` (LLaMA's, and the LLaMA-like models')."""
    if hf.get("model_type", model_type) != model_type:
        raise WeightsError(f"{source}: model_type {hf.get('model_type')!r}, expected {model_type!r}")
    if hf.get("hidden_act", "silu") != "silu":
        raise WeightsError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (LLaMA uses 'silu')")
    rope = hf.get("rope_parameters") or {}
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type") == "llama3" else None)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if scaling is not None and kind not in ("llama3", "default"):
        raise WeightsError(f"{source}: rope scaling {kind!r} is not supported (only llama3)")
    if rope.get("rope_type", "default") not in ("default", "llama3"):
        raise WeightsError(f"{source}: rope_type {rope['rope_type']!r} is not supported (default or llama3)")
    return dict(
        vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads"),
        intermediate_size=hf["intermediate_size"], head_dim=hf.get("head_dim"),
        max_seq_len=hf.get("max_position_embeddings", 2048), rope_theta=float(theta),
        rope_scaling={k: scaling[k] for k in ROPE_SCALING_KEYS} if kind == "llama3" else None,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dropout=float(hf.get("attention_dropout", 0.0) or 0.0), attention_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)), pad_token_id=_pad_id(hf))


def _pad_id(hf):
    """config.json's pad_token_id when it names a row of the embedding (transformers then gives that row no
    gradient: nn.Embedding's padding_idx), else None."""
    pad = hf.get("pad_token_id")
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < hf["vocab_size"] else None


def llama_to_hf_config(cfg, dtype):
    rope = {"rope_type": "llama3" if cfg.rope_scaling else "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope.update(cfg.rope_scaling)
    bos, eos = text_boundary_ids(cfg.vocab_size)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": cfg.pad_token_id,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_seq_len,
            "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope, "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_bias": cfg.attention_bias, "attention_dropout": cfg.dropout, "mlp_bias": cfg.mlp_bias,
            "initializer_range": 0.02, "use_cache": True, "dtype": dtype}


def _weight_files(directory):
    """The safetensors files of a checkpoint directory, with the tensor names each holds (None: all)."""
    index = os.path.join(directory, INDEX)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{index}: expected a 'weight_map' of tensor name -> file")
        files = {}
        for name, file in weight_map.items():
            files.setdefault(file, set()).add(name)
        return [(os.path.join(directory, f), names) for f, names in files.items()]
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"Llama.from_pretrained: {directory} holds neither model.safetensors nor {INDEX}\n"
                                "HINT: pass an HF LlamaForCausalLM directory (save_pretrained writes one)")
    return [(single, None)]


def hf_weights(directory, cls=None):
    """(config, {our name: MappedArray}, {name: file}) of an HF directory of a LLaMA-like model (one safetensors file
    or shards and their index): only the headers are read; a tied output layer is the token embedding. ``cls``: the
    model class (its ``config_from_hf`` and ``from_hf_name``); None: the class of config.json's model_type."""
    from ..pretrained import hf_model_class, read_config_json

    directory = os.fspath(directory)
    hf, config_path = read_config_json(directory, "Llama.from_pretrained")
    if cls is None:
        cls = hf_model_class(hf.get("model_type", "llama"), config_path)
    config = cls.config_from_hf(hf, config_path)
    state, where = {}, {}
    for path, names in _weight_files(directory):
        if not os.path.exists(path):
            raise WeightsError(f"{directory}: shard {os.path.basename(path)} listed in {INDEX} is missing")
        try:
            tensors = mapped_safetensors(path, names)
        except (SafetensorsError, OSError) as exc:
            raise WeightsError(f"{path}: not a readable safetensors file ({exc})") from exc
        for name, value in tensors.items():
            if not name.endswith("rotary_emb.inv_freq"):  # (recomputed from the config)
                name = cls.from_hf_name(name)
                state[name], where[name] = value, path
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight"))
    return config, state, where


def load_hf(cls, directory, dtype=None):
    config, mapped, where = hf_weights(directory, cls)
    return load_checked(cls, config, mapped, where, directory, dtype)


def load_checked(cls, config, mapped, where, directory, dtype=None):
    """A ``cls(config)`` holding ``mapped`` ({our name: array, or None to skip}; ``where``: the file each came from),
    float32 unless ``dtype``, every tensor checked by name and shape and none missing (a WeightsError naming it):
    shared by the HF readers of the models on LLaMA's shell."""
    model = cls(config)
    if dtype is not None:
        model.to(dtype=dtype)
    expected = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
    state = {}
    for name, value in progress(mapped.items(), total=len(mapped), desc="loading weights", unit="tensor"):
        if value is None:
            continue
        if name not in expected:
            raise WeightsError(f"{where.get(name, directory)}: unexpected tensor {name!r} (shape {value.shape}) "
                               f"for {config}")
        shape, want = expected[name]
        if tuple(value.shape) != shape:
            raise WeightsError(f"{where.get(name, directory)}: tensor {name!r} has shape {tuple(value.shape)}, "
                               f"expected {shape}")
        state[name] = np.ascontiguousarray(np.asarray(value).astype(want))
    missing = [k for k in expected if state.get(k) is None]
    if missing:
        raise WeightsError(f"{directory}: missing tensors {missing[:5]} ({len(missing)} in all)")
    model.load_state_dict(state)
    return model


def _bytes(size):
    if isinstance(size, int):
        return size
    match = _SIZE.match(str(size))
    if not match:
        raise ValueError(f"save_pretrained: max_shard_size expected a size like '5GB' or '500MB', got {size!r}")
    return int(float(match.group(1)) * {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}[match.group(2).upper()])


def save_hf(model, directory, max_shard_size="5GB", dtype=None):
    """config.json and the weights, in shards of at most ``max_shard_size`` (with an index) when larger."""
    cfg = model.config
    tensors = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        array = value.numpy()
        tensors[model.to_hf_name(name)] = array.astype(backend.as_dtype(dtype)) if dtype is not None else array
    limit = _bytes(max_shard_size)
    shards, current, size = [], {}, 0
    for name, array in tensors.items():
        if current and size + array.nbytes > limit:
            shards.append(current)
            current, size = {}, 0
        current[name] = array
        size += array.nbytes
    shards.append(current)
    os.makedirs(directory, exist_ok=True)
    stored = next(iter(tensors.values())).dtype
    if len(shards) == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), shards[0], {"format": "pt"})
        stale = os.path.join(directory, INDEX)
        if os.path.exists(stale):
            os.unlink(stale)
    else:
        stale = os.path.join(directory, "model.safetensors")
        if os.path.exists(stale):
            os.unlink(stale)
        weight_map = {}
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(directory, file), shard, {"format": "pt"})
            weight_map.update({name: file for name in shard})
        index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}, "weight_map": weight_map}
        text = json.dumps(index, indent=2).encode()
        _atomic_write(os.path.join(directory, INDEX), lambda f: f.write(text))
    text = json.dumps(model.hf_config("bfloat16" if stored == backend.bfloat16 else str(stored)), indent=2).encode()
    _atomic_write(os.path.join(directory, "config.json"), lambda f: f.write(text))


__all__ = ["load_hf", "load_checked", "save_hf", "hf_weights", "hf_config_to_llama", "llama_config_fields",
           "llama_to_hf_config"]
