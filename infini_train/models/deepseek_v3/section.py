"""How DeepSeek-V3 reads a run config's model section (models/model_section.py): the shared keys in GPT-2's names
(n_embd = dim, n_layer = n_layers, n_head = n_heads, block_size = max_seq_len, bias = the attention's biases), LLaMA's
keys it shares (intermediate_size, rope_theta, rms_norm_eps, tie_embeddings, the experts' num_experts,
num_experts_per_tok, moe_intermediate_size, norm_topk_prob), multi-head latent attention's ranks and head widths,
DeepSeek-MoE's routing keys and YaRN's rope scaling (rope_scaling_factor 0: none). Explicit keys override the preset,
and without a preset HF's defaults (the full-size shape)."""
from __future__ import annotations

from ..llama.section import _KEYS as LLAMA_KEYS
from ..llama.section import NAMES as LLAMA_NAMES
from ..model_section import AT_LEAST_ONE, POSITIVE, RunKey, at_least_zero
from ..moe_section import MoESection

ROPE_SCALING = {  # run key -> its name in DeepseekV3Config.rope_scaling (YaRN)
    "rope_scaling_factor": "factor", "rope_original_context": "original_max_position_embeddings",
    "rope_beta_fast": "beta_fast", "rope_beta_slow": "beta_slow", "rope_mscale": "mscale",
    "rope_mscale_all_dim": "mscale_all_dim"}
DEFAULT_SCALING = {"factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                   "mscale": 1.0, "mscale_all_dim": 1.0}
_OWN = (
    RunKey("q_lora_rank", int, "deepseek_v3: rank of the low-rank query path (q_a_proj -> norm -> q_b_proj); 0: the "
                               "direct q_proj; null: the preset's, else 1536", at_least_zero("the direct q_proj")),
    RunKey("kv_lora_rank", int, "deepseek_v3: width of the compressed key/value latent (what the KV cache keeps); "
                                "null: 512", AT_LEAST_ONE),
    RunKey("qk_nope_head_dim", int, "deepseek_v3: each head's query/key width without rotation; null: 128",
           AT_LEAST_ONE),
    RunKey("qk_rope_head_dim", int, "deepseek_v3: the rotary query/key width (the rope key is shared by the heads; "
                                    "even); null: 64", (lambda v: v >= 2 and v % 2 == 0, "an even integer >= 2")),
    RunKey("v_head_dim", int, "deepseek_v3: each head's value width; null: 128", AT_LEAST_ONE),
    RunKey("rope_interleave", bool, "deepseek_v3: rotary pairs interleaved (x0, x1), (x2, x3), ... as DeepSeek's "
                                    "checkpoints; null: true"),
    RunKey("rope_beta_fast", float, "deepseek_v3 YaRN: beta_fast; null: 32", POSITIVE),
    RunKey("rope_beta_slow", float, "deepseek_v3 YaRN: beta_slow; null: 1", POSITIVE),
    RunKey("rope_mscale", float, "deepseek_v3 YaRN: mscale; null: 1", at_least_zero("unset")),
    RunKey("rope_mscale_all_dim", float, "deepseek_v3 YaRN: mscale_all_dim (also scales the softmax); null: 1",
           at_least_zero("unset")),
    RunKey("first_k_dense_replace", int, "deepseek_v3: the first layers kept dense (the others DeepSeek-MoE); null: "
                                         "3", (lambda v: v >= 0, "an integer >= 0")),
    RunKey("n_shared_experts", int, "deepseek_v3: shared experts every token passes through; null: 1",
           (lambda v: v >= 0, "an integer >= 0")),
    RunKey("routed_scaling_factor", float, "deepseek_v3: the routed experts' weights' factor; null: 2.5", POSITIVE),
    RunKey("n_group", int, "deepseek_v3: expert groups of group-limited routing (dividing num_experts); null: 8",
           AT_LEAST_ONE),
    RunKey("topk_group", int, "deepseek_v3: groups each token's experts come from; null: 4", AT_LEAST_ONE),
    RunKey("bias_update_rate", float, "deepseek_v3: the auxiliary-loss-free correction bias's step per optimizer "
                                      "step; 0: frozen; null: 0.001", at_least_zero("frozen")),
    RunKey("seq_aux_loss_alpha", float, "deepseek_v3: weight of the sequence-wise balance loss; 0: none; null: 0",
           at_least_zero("none")),
    RunKey("num_nextn_predict_layers", int, "deepseek_v3: multi-token prediction modules (each predicts one token "
                                            "further; loss weight train.mtp_loss_weight); 0: none; null: 0",
           at_least_zero("none")),
)
KEYS = tuple(LLAMA_KEYS[k] for k in ("intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings",
                                     "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                                     "rope_scaling_factor", "rope_original_context")) + _OWN
NAMES = {**LLAMA_NAMES, "num_experts": "n_routed_experts"}
PRESET_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "intermediate_size", "rope_theta", "rms_norm_eps",
               "tie_embeddings", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
               *ROPE_SCALING, *(k.name for k in _OWN if not k.name.startswith("rope_beta")
                                and k.name not in ("rope_mscale", "rope_mscale_all_dim")))


class DeepseekV3Section(MoESection):
    EXPERT_MODULES = ("model.layers.3.mlp.experts.0.gate_proj", "model.layers.3.mlp.experts.0.up_proj",
                      "model.layers.3.mlp.experts.0.down_proj", "model.layers.3.mlp.gate",
                      "model.layers.3.mlp.shared_experts.gate_proj")

    def given(self, m):
        """The explicit keys in DeepseekV3Config's names, but bias and the rope scaling keys (model_config sets
        those); q_lora_rank 0 is None."""
        fields = {k: v for k, v in super().given(m).items() if k != "bias" and k not in ROPE_SCALING}
        if fields.get("q_lora_rank") == 0:
            fields["q_lora_rank"] = None
        return fields

    def model_config(self, m):
        config_class = self.spec().config_class
        fields = dict(config_class.presets()[m.preset]) if m.preset else {}
        fields.update(self.given(m))
        if m.bias is not None:
            fields["attention_bias"] = m.bias
        scaling = fields.get("rope_scaling")
        if m.rope_scaling_factor == 0:
            scaling = None
        elif scaling is not None or any(getattr(m, key) is not None for key in ROPE_SCALING):
            scaling = dict(scaling or DEFAULT_SCALING)
            scaling.update({name: getattr(m, key) for key, name in ROPE_SCALING.items() if getattr(m, key) is not None})
        fields["rope_scaling"] = scaling
        return config_class(**fields)

    def preset_value(self, preset, key):
        if key in ROPE_SCALING:
            scaling = preset.get("rope_scaling") or {}
            return scaling.get(ROPE_SCALING[key], 0 if key == "rope_scaling_factor" else None)
        if key == "q_lora_rank":
            return preset.get("q_lora_rank") or 0
        return super().preset_value(preset, key)

    def resolved_values(self, config):
        built = super().resolved_values(config)
        scaling = built["rope_scaling"] or {"factor": 0.0}
        built.update({key: scaling.get(name) for key, name in ROPE_SCALING.items()})
        built["bias"] = built["attention_bias"]
        built["q_lora_rank"] = built["q_lora_rank"] or 0
        return built

    def config_error(self, text):
        if text.startswith("DeepseekV3Config: n_group"):
            return f"model.n_group: {text.partition(': ')[2]}"
        return None

    def model_problems(self, m, config):
        if not any(config.sparse_layer(i) for i in range(config.n_layers)):
            key = "model.first_k_dense_replace" if m.first_k_dense_replace is not None else "model.n_layer"
            return [f"{key}: expected first_k_dense_replace ({config.first_k_dense_replace}) below n_layer "
                    f"({config.n_layers}) for a run of model.arch=deepseek_v3 (a mixture-of-experts run needs a "
                    "DeepSeek-MoE layer), got every layer dense; HINT: lower model.first_k_dense_replace"]
        scaling = config.rope_scaling
        if scaling and scaling["original_max_position_embeddings"] > config.max_seq_len:
            key = "model.rope_original_context" if m.rope_original_context is not None else "model.block_size"
            return [f"{key}: expected rope_original_context ({scaling['original_max_position_embeddings']}) <= "
                    f"block_size ({config.max_seq_len}) with YaRN rope scaling (it stretches the original context to "
                    "block_size), got more; HINT: lower model.rope_original_context, or set "
                    "model.rope_scaling_factor=0 for no scaling"]
        return []


SECTIONS = {"deepseek_v3": DeepseekV3Section(
    "deepseek_v3", ".deepseek_v3.model", keys=KEYS, preset_keys=PRESET_KEYS, preset_doc="deepseek-v3, deepseek-v3-tiny",
    hf_model_type="deepseek_v3", names=NAMES, experts=True)}

__all__ = ["DeepseekV3Section", "SECTIONS", "ROPE_SCALING"]
