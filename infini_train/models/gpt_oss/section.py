"""How gpt-oss reads a run config's model section (models/model_section.py): LLaMA's shared and block keys (in
GPT-2's names), the experts' keys, and its own: ``sliding_window`` (0: every layer full attention; else the layers
alternate, sliding first, as HF's default ``layer_types``), the clamped SwiGLU's ``swiglu_alpha`` /
``swiglu_limit``, and YaRN's ``yarn_factor`` (0: no rope scaling) / ``yarn_original_context``. A pretrained
directory's config.json keeps its own layer_types. Expert parallelism is refused (the experts are stacked tensors,
whole on every rank)."""
from __future__ import annotations

from ..llama.section import LlamaMoESection, NAMES, _keys
from ..model_section import AT_LEAST_ONE, POSITIVE, RunKey, at_least_zero

GPT_OSS_KEYS = (
    RunKey("sliding_window", int, "gpt_oss: keys a sliding-window layer's query sees (itself included); the layers "
                                  "alternate sliding / full, sliding first; 0: every layer full attention; null: the "
                                  "preset's, else 128", at_least_zero("every layer full attention")),
    RunKey("swiglu_alpha", float, "gpt_oss: the experts' SwiGLU sigmoid gain; null: 1.702", POSITIVE),
    RunKey("swiglu_limit", float, "gpt_oss: the experts' clamp of the gate (above) and up projection (both sides); "
                                  "null: 7.0", POSITIVE),
    RunKey("yarn_factor", float, "gpt_oss: YaRN rope scaling factor; 0: no scaling; null: the preset's, else 32",
           at_least_zero("no rope scaling")),
    RunKey("yarn_original_context", int, "gpt_oss: YaRN's original context (original_max_position_embeddings); "
                                         "null: the preset's, else 4096", AT_LEAST_ONE),
)
YARN = {"yarn_factor": "factor", "yarn_original_context": "original_max_position_embeddings"}
PRESET_KEYS = ("n_layer", "n_head", "n_embd", "n_kv_head", "intermediate_size", "block_size", "rope_theta",
               "rms_norm_eps", "tie_embeddings", "head_dim", "num_experts", "num_experts_per_tok",
               "router_aux_loss_coef", *(k.name for k in GPT_OSS_KEYS))


class GptOssSection(LlamaMoESection):
    EXPERT_MODULES = ("model.layers.0.mlp.experts", "model.layers.0.mlp.router")

    def given(self, m):
        """The explicit keys in GptOssConfig's names, but those model_config maps itself."""
        return {k: v for k, v in super().given(m).items() if k not in YARN and k != "sliding_window"}

    def model_config(self, m):
        from .config import GPT_OSS_YARN, alternating_layers

        config_class = self.spec().config_class
        fields = dict(config_class.presets()[m.preset]) if m.preset else {}
        if m.n_head is not None and m.n_kv_head is None and not m.preset:
            fields["n_kv_heads"] = m.n_head
        fields.update(self.given(m))
        if m.bias is not None:
            fields["attention_bias"] = m.bias
        yarn = fields.get("rope_scaling", dict(GPT_OSS_YARN))
        if m.yarn_factor == 0:
            yarn = None
        elif any(getattr(m, key) is not None for key in YARN):
            yarn = dict(yarn or GPT_OSS_YARN)
            yarn.update({name: getattr(m, key) for key, name in YARN.items() if getattr(m, key) is not None})
        fields["rope_scaling"] = yarn
        if m.sliding_window is not None:
            fields["sliding_window"] = m.sliding_window or None
            layers = fields.get("n_layers", config_class.n_layers)
            fields["layer_types"] = (alternating_layers(layers) if m.sliding_window
                                     else ["full_attention"] * layers)
        return config_class(**fields)

    def preset_value(self, preset, key):
        if key in YARN:
            return (preset.get("rope_scaling") or {}).get(YARN[key], 0 if key == "yarn_factor" else None)
        return super().preset_value(preset, key)

    def resolved_values(self, config):
        built = super().resolved_values(config)
        yarn = config.rope_scaling or {"factor": 0.0}
        built.update({key: yarn.get(name) for key, name in YARN.items()})
        built["sliding_window"] = config.sliding_window if "sliding_attention" in config.layer_types else 0
        built["bias"] = config.attention_bias
        return built

    def model_problems(self, m, config):
        scaling = config.rope_scaling
        if scaling and scaling["original_max_position_embeddings"] >= config.max_seq_len:
            key = "model.yarn_original_context" if m.yarn_original_context is not None else "model.block_size"
            return [f"{key}: expected yarn_original_context ({scaling['original_max_position_embeddings']}) < "
                    f"block_size ({config.max_seq_len}) with YaRN rope scaling (it stretches the original context), "
                    "got both; HINT: lower model.yarn_original_context, or set model.yarn_factor=0 for no scaling"]
        return []

    def expert_parallel_problems(self, cfg, ok, config):
        e = cfg.parallel.expert
        if ok("parallel.expert") and e > 1:
            return [f"parallel.expert: expected 1 for model.arch=gpt_oss (its experts are stacked tensors kept whole "
                    f"on every rank; expert parallelism for them is not supported yet), got {e}; HINT: set "
                    "parallel.expert=1 and use data or tensor parallelism"]
        return []


SECTIONS = {
    "gpt_oss": GptOssSection(
        "gpt_oss", ".gpt_oss.model",
        keys=_keys("n_kv_head", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings", "head_dim",
                   "num_experts", "num_experts_per_tok", "router_aux_loss_coef") + GPT_OSS_KEYS,
        preset_keys=PRESET_KEYS, preset_doc="gpt-oss-20b, gpt-oss-120b, gpt-oss-tiny", hf_model_type="gpt_oss",
        names=NAMES, experts=True, expert_parallel=False),
}

__all__ = ["GptOssSection", "SECTIONS", "GPT_OSS_KEYS"]
