"""How LLaMA-3 and the archs on its blocks (Qwen3, Qwen3-MoE, Mixtral) read a run config's model section
(models/model_section.py): the shared keys in GPT-2's names mapped onto LLaMA's (n_embd = dim, n_layer = n_layers,
n_head = n_heads, block_size = max_seq_len, bias = attention and MLP biases), the keys of LLaMA's blocks, LLaMA-3's
rope scaling and the experts' keys; explicit keys override the preset, and without a preset the arch's defaults."""
from __future__ import annotations

import re

from ..model_section import AT_LEAST_ONE, POSITIVE, ModelSection, RunKey, at_least_zero
from ..moe_section import MoESection

_KEYS = {k.name: k for k in (  # every key of the family; each arch takes those SECTIONS lists, in its order
    RunKey("n_kv_head", int, "llama3: key/value heads, dividing n_head (grouped-query attention); null: the preset's, "
                             "else n_head", AT_LEAST_ONE),
    RunKey("intermediate_size", int, "llama3: SwiGLU hidden width; null: default", AT_LEAST_ONE),
    RunKey("rope_theta", float, "llama3: rotary base; null: default (500000)", POSITIVE),
    RunKey("rope_scaling_factor", float, "llama3: llama3 rope scaling factor; 0: no scaling; null: the preset's, or "
                                         "none without a preset (8 when another rope_* scaling key is given)",
           at_least_zero("no scaling")),
    RunKey("rope_low_freq_factor", float, "llama3 rope scaling: low frequency factor; null: 1", POSITIVE),
    RunKey("rope_high_freq_factor", float, "llama3 rope scaling: high frequency factor; null: 4", POSITIVE),
    RunKey("rope_original_context", int, "llama3 rope scaling: original context; null: 8192", AT_LEAST_ONE),
    RunKey("rms_norm_eps", float, "llama3: RMSNorm epsilon; null: default (1e-5)", POSITIVE),
    RunKey("tie_embeddings", bool, "llama3: output layer tied to the token embedding; null: default"),
    RunKey("head_dim", int, "llama3 and the archs on its blocks: width of one attention head (even); null: the "
                            "preset's, else n_embd / n_head",
           (lambda v: v >= 2 and v % 2 == 0, "an even integer >= 2 (rotary embeddings rotate pairs)")),
    RunKey("num_experts", int, "qwen3_moe | mixtral: experts of each sparse layer; null: 128 | 8", AT_LEAST_ONE),
    RunKey("num_experts_per_tok", int, "qwen3_moe | mixtral: experts each token is routed to (top-k); null: 8 | 2",
           AT_LEAST_ONE),
    RunKey("router_aux_loss_coef", float, "qwen3_moe | mixtral: weight of the load-balancing loss added to the "
                                          "training loss; null: 0.001",
           at_least_zero("no load-balancing loss")),
    RunKey("moe_intermediate_size", int, "qwen3_moe: each expert's SwiGLU width (mixtral's experts are "
                                         "intermediate_size wide); null: 768", AT_LEAST_ONE),
    RunKey("norm_topk_prob", bool, "qwen3_moe: renormalise the chosen experts' weights (mixtral always does); null: "
                                   "false"),
    RunKey("decoder_sparse_step", int, "qwen3_moe: layer i is sparse when (i + 1) % step == 0; null: 1", AT_LEAST_ONE),
    RunKey("mlp_only_layers", list, "qwen3_moe: indices of layers kept dense (a list); null: []",
           (lambda v: all(i >= 0 for i in v), "a list of layer indices >= 0")),
)}
ROPE_SCALING = {  # LLaMA-3's rope scaling keys -> their name in LlamaConfig.rope_scaling
    "rope_scaling_factor": "factor", "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor", "rope_original_context": "original_max_position_embeddings"}
DEFAULT_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
NAMES = {"n_embd": "dim", "n_layer": "n_layers", "n_head": "n_heads", "n_kv_head": "n_kv_heads",
         "block_size": "max_seq_len", "tie_embeddings": "tie_word_embeddings"}


def _keys(*names):
    return tuple(_KEYS[name] for name in names)


BLOCK_KEYS = ("n_kv_head", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings", "head_dim")
EXPERT_KEYS = ("num_experts", "num_experts_per_tok", "router_aux_loss_coef")
QWEN3_MOE_KEYS = ("moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
PRESET_KEYS = ("n_layer", "n_head", "n_embd", "n_kv_head", "intermediate_size", "block_size", "rope_theta",
               *ROPE_SCALING, "rms_norm_eps", "tie_embeddings", "head_dim", *EXPERT_KEYS, *QWEN3_MOE_KEYS)


class LlamaSection(ModelSection):
    def given(self, m):
        """The explicit keys in LlamaConfig's names, but bias and the rope scaling keys (model_config sets those)."""
        return {k: v for k, v in super().given(m).items() if k != "bias" and k not in ROPE_SCALING}

    def model_config(self, m):
        """The arch's config class (LlamaConfig or its subclass) from the preset, or the arch's defaults (n_kv_head:
        n_head's), the explicit keys and, for llama3, the rope scaling: none without a preset unless a rope_* scaling
        key is given (transformers' LlamaConfig), else the preset's (or DEFAULT_SCALING) with the given keys over it;
        none for factor 0."""
        config_class = self.spec().config_class
        fields = dict(config_class.presets()[m.preset]) if m.preset else {}
        if m.n_head is not None and m.n_kv_head is None and not m.preset:
            fields["n_kv_heads"] = m.n_head
        fields.update(self.given(m))
        if m.bias is not None:
            fields["attention_bias"] = fields["mlp_bias"] = m.bias
        if not self.takes("rope_scaling_factor"):
            return config_class(**fields)
        scaling = fields.get("rope_scaling")
        if m.rope_scaling_factor == 0:
            scaling = None
        elif scaling is not None or any(getattr(m, key) is not None for key in ROPE_SCALING):
            scaling = dict(scaling or DEFAULT_SCALING)
            scaling.update({name: getattr(m, key) for key, name in ROPE_SCALING.items() if getattr(m, key) is not None})
        fields["rope_scaling"] = scaling
        return config_class(**fields)

    def preset_value(self, preset, key):
        if key in ROPE_SCALING:  # (a preset without scaling: factor 0)
            scaling = preset.get("rope_scaling") or {}
            return scaling.get(ROPE_SCALING[key], 0 if key == "rope_scaling_factor" else None)
        return super().preset_value(preset, key)

    def resolved_values(self, config):
        built = super().resolved_values(config)
        scaling = built["rope_scaling"] or {"factor": 0.0}  # 0: no scaling
        built.update({key: scaling.get(name) for key, name in ROPE_SCALING.items()})
        if built["attention_bias"] == built["mlp_bias"]:
            built["bias"] = built["attention_bias"]
        return built

    def model_problems(self, m, config):
        """LLaMA-3's rope scaling against the context, and Qwen3-MoE's dense layers against the depth."""
        problems = []
        scaling = config.rope_scaling
        if scaling and scaling["original_max_position_embeddings"] >= config.max_seq_len:
            key = "model.rope_original_context" if m.rope_original_context is not None else "model.block_size"
            problems.append(f"{key}: expected rope_original_context ({scaling['original_max_position_embeddings']}) "
                            f"< block_size ({config.max_seq_len}) with llama3 rope scaling (it rescales the "
                            "frequencies beyond the original context, and Hugging Face transformers rejects such a "
                            "config), got both; HINT: set model.rope_original_context below block_size, "
                            "model.rope_scaling_factor=0 for no scaling, or keep the preset's block_size and shorten "
                            "train.sequence_length instead")
        layers = (m.mlp_only_layers or []) if self.takes("mlp_only_layers") else []
        if any(i >= config.n_layers for i in layers):
            problems.append(f"model.mlp_only_layers: expected layer indices below n_layer ({config.n_layers}), got "
                            f"{layers}")
        return problems


class LlamaMoESection(MoESection, LlamaSection):
    EXPERT_MODULES = ("model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0.up_proj",
                      "model.layers.0.mlp.experts.0.down_proj", "model.layers.0.mlp.gate")

    def config_error(self, text):
        if re.match(r"\w+MoeConfig: no layer is sparse", text):
            return f"model.decoder_sparse_step: {text.partition(': ')[2]}"
        return None


def _section(kind, arch, module, keys, preset_doc, hf_model_type, **flags):
    return kind(arch, module, keys=_keys(*keys), preset_keys=PRESET_KEYS, preset_doc=preset_doc,
                hf_model_type=hf_model_type, names=NAMES, **flags)


SECTIONS = {
    "llama3": _section(LlamaSection, "llama3", ".llama.model", BLOCK_KEYS[:3] + tuple(ROPE_SCALING) + BLOCK_KEYS[3:],
                       "llama3.2-1b, ...", "llama"),
    "qwen3": _section(LlamaSection, "qwen3", ".llama.qwen3", BLOCK_KEYS, "qwen3-0.6b, qwen3-8b", "qwen3",
                      biases=False),
    "qwen3_moe": _section(LlamaMoESection, "qwen3_moe", ".llama.qwen3_moe", BLOCK_KEYS + EXPERT_KEYS + QWEN3_MOE_KEYS,
                          "qwen3-30b-a3b", "qwen3_moe", biases=False, experts=True),
    "mixtral": _section(LlamaMoESection, "mixtral", ".llama.mixtral", BLOCK_KEYS + EXPERT_KEYS, "mixtral-8x7b",
                        "mixtral", biases=False, experts=True),
}

__all__ = ["LlamaSection", "LlamaMoESection", "SECTIONS", "ROPE_SCALING", "NAMES", "PRESET_KEYS"]
