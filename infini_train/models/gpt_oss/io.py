"""gpt-oss's Hugging Face config.json both ways (transformers 5's ``rope_parameters`` or the released checkpoints'
``rope_theta`` + ``rope_scaling``; ``layer_types``, ``sliding_window``, the experts' keys). The weights are read and
written by LLaMA's safetensors code (llama/io.py): our names are HF's, the experts stacked as HF stores them. The
released checkpoints' MXFP4-quantised experts (``*_blocks`` / ``*_scales``) are refused with a clear error."""
from __future__ import annotations

from ..gpt2.io import WeightsError
from ..llama.io import _pad_id
from ..special_tokens import text_boundary_ids
from ..yarn import YARN_KEYS
from .config import GptOssConfig


def _rope(hf, source):
    """(rope_theta, YaRN parameters or None) of an HF config dict."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    theta = rope.get("rope_theta", hf.get("rope_theta", 150000.0))
    if scaling is None:
        return float(theta), None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise WeightsError(f"{source}: rope_type {kind!r} is not supported for gpt_oss (yarn or default)")
    return float(theta), {k: scaling[k] for k in YARN_KEYS if scaling.get(k) is not None}


def hf_config_to_gpt_oss(hf, source):
    """Our GptOssConfig from an HF config.json dict."""
    if hf.get("model_type", "gpt_oss") != "gpt_oss":
        raise WeightsError(f"{source}: model_type {hf.get('model_type')!r}, expected 'gpt_oss'")
    quant = hf.get("quantization_config")
    if quant:
        raise WeightsError(f"{source}: quantized weights ({quant.get('quant_method', quant)}) are not supported\n"
                           "HINT: dequantize to bfloat16 first (transformers: GptOssForCausalLM.from_pretrained(..., "
                           "quantization_config=Mxfp4Config(dequantize=True)), then save_pretrained)")
    if hf.get("hidden_act", "silu") != "silu":
        raise WeightsError(f"{source}: hidden_act {hf['hidden_act']!r} is not supported (gpt-oss uses 'silu')")
    theta, yarn = _rope(hf, source)
    try:
        return GptOssConfig(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads"),
            intermediate_size=hf["intermediate_size"], head_dim=hf.get("head_dim"),
            max_seq_len=hf.get("max_position_embeddings", 131072), rope_theta=theta, rope_scaling=yarn,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5), tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            dropout=float(hf.get("attention_dropout", 0.0) or 0.0),
            attention_bias=bool(hf.get("attention_bias", True)), pad_token_id=_pad_id(hf),
            sliding_window=hf.get("sliding_window", 128), layer_types=hf.get("layer_types"),
            num_experts=hf.get("num_local_experts", hf.get("num_experts")),
            num_experts_per_tok=hf["num_experts_per_tok"], swiglu_alpha=float(hf.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(hf.get("swiglu_limit", 7.0)),
            router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.9)))
    except (ValueError, TypeError, KeyError) as exc:
        raise WeightsError(f"{source}: not a gpt-oss config this package takes ({exc})") from exc


def gpt_oss_to_hf_config(cfg, dtype):
    """The HF config.json dict of ``cfg`` (weights stored in ``dtype``, a name)."""
    rope = {"rope_type": "yarn" if cfg.rope_scaling else "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope.update(cfg.rope_scaling)
    bos, eos = text_boundary_ids(cfg.vocab_size)
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_act": "silu",
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": cfg.pad_token_id,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "attention_dropout": cfg.dropout, "sliding_window": cfg.sliding_window,
            "layer_types": list(cfg.layer_types), "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok, "swiglu_alpha": cfg.swiglu_alpha,
            "swiglu_limit": cfg.swiglu_limit, "router_aux_loss_coef": cfg.router_aux_loss_coef,
            "output_router_logits": False, "initializer_range": 0.02, "use_cache": True, "dtype": dtype}


__all__ = ["hf_config_to_gpt_oss", "gpt_oss_to_hf_config"]
