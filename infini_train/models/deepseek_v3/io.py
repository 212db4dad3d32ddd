"""DeepSeek-V3 weights in the Hugging Face layout: config.json (transformers 5's ``rope_parameters``, or the released
checkpoints' ``rope_theta`` + ``rope_scaling``) both ways, and the safetensors through LLaMA's readers and writer
(llama/io.py: the tensor names are HF's). The multi-token prediction layers of a checkpoint (``model.layers.{N+k}``,
k < num_nextn_predict_layers) are our ``mtp.{k}`` (mtp.py), their shared embedding and head read by tying and written
as the checkpoints have them; the correction bias
(``mlp.gate.e_score_correction_bias``) is a buffer, read and written with the weights."""
from __future__ import annotations

import os
import re


from ...safetensors_io import read_header
from ..gpt2.io import WeightsError
from ..llama import io as llama_io
from ..special_tokens import text_boundary_ids
from .config import DeepseekV3Config
from ..yarn import YARN_KEYS

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
MTP_SHARED = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
_DIRECT = ("vocab_size", "intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
           "v_head_dim", "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
           "n_shared_experts", "routed_scaling_factor", "norm_topk_prob", "rope_interleave", "rms_norm_eps",
           "attention_bias", "num_nextn_predict_layers")


def hf_config_to_deepseek_v3(hf, source):
    """Our DeepseekV3Config from an HF config.json dict."""
    if hf.get("model_type", "deepseek_v3") != "deepseek_v3":
        raise WeightsError(f"{source}: model_type {hf.get('model_type')!r}, expected 'deepseek_v3'")
    if hf.get("hidden_act", "silu") != "silu":
        raise WeightsError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (DeepSeek-V3 uses 'silu')")
    rope = dict(hf.get("rope_parameters") or {})
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    scaling = hf.get("rope_scaling") or rope
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise WeightsError(f"{source}: rope scaling {kind!r} is not supported (default or yarn)")
    fields = {k: hf[k] for k in _DIRECT if k in hf and hf[k] is not None}
    fields.update(dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
                  max_seq_len=hf.get("max_position_embeddings", 4096), rope_theta=float(theta),
                  rope_scaling={k: scaling[k] for k in YARN_KEYS if k in scaling} if kind == "yarn" else None,
                  tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                  dropout=float(hf.get("attention_dropout", 0.0) or 0.0), pad_token_id=llama_io._pad_id(hf),
                  n_group=hf.get("n_group", 8) or 1, topk_group=hf.get("topk_group", 4) or 1,
                  q_lora_rank=hf.get("q_lora_rank", 1536))  # (HF's defaults where config.json has no key)
    if fields.get("num_nextn_predict_layers") and os.path.isfile(source):  # (a directory's config.json)
        fields["num_nextn_predict_layers"] = stored_mtp_layers(os.path.dirname(source), fields["n_layers"],
                                                               fields["num_nextn_predict_layers"])
    try:
        return DeepseekV3Config(**fields)
    except ValueError as exc:
        raise WeightsError(f"{source}: {exc}") from exc


def stored_mtp_layers(directory, n_layers, depths):
    """How many of config.json's ``depths`` MTP modules the directory's weights hold: depth j when
    ``model.layers.{N+j}.eh_proj.weight`` is stored (transformers writes num_nextn_predict_layers = 1, its default,
    without them: such a directory reads as a model without MTP)."""
    names = set()
    try:
        for path, listed in llama_io._weight_files(directory):
            names |= set(listed) if listed is not None else set(read_header(path)[0])
    except (OSError, ValueError):
        return depths  # (no readable weights here: the config alone)
    count = 0
    while count < depths and f"model.layers.{n_layers + count}.eh_proj.weight" in names:
        count += 1
    return count


def deepseek_v3_to_hf_config(cfg, dtype):
    rope = {"rope_type": "yarn" if cfg.rope_scaling else "default", "rope_theta": cfg.rope_theta}
    rope.update(cfg.rope_scaling or {})
    bos, eos = text_boundary_ids(cfg.vocab_size)
    hf = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
          "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": cfg.pad_token_id, "hidden_size": cfg.dim,
          "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads,
          "max_position_embeddings": cfg.max_seq_len, "rope_parameters": rope,
          "tie_word_embeddings": cfg.tie_word_embeddings, "attention_dropout": cfg.dropout, "n_group": cfg.n_group,
          "topk_group": cfg.topk_group, "initializer_range": 0.02, "use_cache": True,
          "dtype": dtype}
    hf.update({k: getattr(cfg, k) for k in _DIRECT})
    return hf


def hf_weights(directory, cls):
    """(config, {our name: tensor read box by box}, {name: file}) of an HF DeepSeek-V3 directory. Its multi-token
    prediction layers ``model.layers.{N+j}`` (j < num_nextn_predict_layers) are ``mtp.{j}`` here; their
    ``embed_tokens`` and ``shared_head.head`` are read by tying (the model's embedding and output layer); layers past
    them are skipped."""
    config, state, where = llama_io.hf_weights(directory, cls)
    N, D = config.n_layers, config.num_nextn_predict_layers
    for name in [n for n in state if (m := _LAYER.match(n)) and int(m.group(1)) >= N]:
        value, file = state.pop(name), where.pop(name, None)
        j, rest = int(_LAYER.match(name).group(1)) - N, name[_LAYER.match(name).end():]
        if j < D and rest not in MTP_SHARED:
            state[f"mtp.{j}.{rest}"], where[f"mtp.{j}.{rest}"] = value, file
    for j in range(D):
        for rest, main in MTP_SHARED.items():
            state[f"mtp.{j}.{rest}"] = state.get(main)
    return config, state, where


def mtp_to_hf_name(name, n_layers):
    """HF's name of our ``mtp.{j}.*`` tensor (``model.layers.{N+j}.*``); other names unchanged."""
    if not name.startswith("mtp."):
        return name
    j, _, rest = name[4:].partition(".")
    return f"model.layers.{n_layers + int(j)}.{rest}"


def load_hf(cls, directory, dtype=None):
    """The model of an HF directory with its weights (float32 unless ``dtype``), every tensor checked by name and
    shape."""
    config, mapped, where = hf_weights(directory, cls)
    return llama_io.load_checked(cls, config, mapped, where, directory, dtype)


__all__ = ["hf_config_to_deepseek_v3", "deepseek_v3_to_hf_config", "hf_weights", "load_hf", "mtp_to_hf_name"]
