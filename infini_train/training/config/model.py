"""The ``model`` section of a run config: the architecture (gpt2 | llama3 | qwen3 | qwen3_moe | mixtral), a preset and
explicit fields, resolved into a GPT2Config, or the LlamaConfig (Qwen3Config, Qwen3MoeConfig, MixtralConfig) of the
arch; and ``_key``, the field helper every section uses."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional


def _key(default, doc):
    """A setting whose one-line ``doc`` ``train.py --help`` lists beside its dotted key."""
    return field(default=default, metadata={"doc": doc})


LLAMA_LIKE = ("llama3", "qwen3", "qwen3_moe", "mixtral")  # the archs on LLaMA's blocks
MOE_ARCHS = ("qwen3_moe", "mixtral")
MOE_KEYS = ("num_experts", "num_experts_per_tok", "router_aux_loss_coef", "moe_intermediate_size", "norm_topk_prob",
            "decoder_sparse_step", "mlp_only_layers")
ARCH_KEYS = {  # the keys GPT-2 has not -> the archs that have them
    **dict.fromkeys(("n_kv_head", "intermediate_size", "rope_theta", "rms_norm_eps", "tie_embeddings", "head_dim"),
                    LLAMA_LIKE),
    **dict.fromkeys(("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context"),
                    ("llama3",)),
    **dict.fromkeys(MOE_KEYS[:3], MOE_ARCHS),
    **dict.fromkeys(MOE_KEYS[3:], ("qwen3_moe",)),
}


@dataclass
class ModelConfig:
    """The model: ``arch`` gpt2 (GPT2Config), llama3 (LlamaConfig), qwen3, qwen3_moe or mixtral (their configs, all
    LlamaConfigs), a preset of that arch (GPT2_PRESETS: gpt2, d12, ...; LLAMA_PRESETS: llama3.2-1b, ...; qwen3-0.6b,
    qwen3-8b; qwen3-30b-a3b; mixtral-8x7b) and/or explicit fields. A key belongs to the archs ARCH_KEYS names (any
    for the shared ones); Qwen3's q/k norm comes with the arch. Explicit (non-null) fields override the
    preset, and without a preset the arch's defaults. The preset defines the architecture (PRESET_KEYS: the shape and
    context, and for llama3 the rope, norm and tying settings): an explicit one that differs from the preset's is
    reported (``preset_overrides``; the run prints a warning for each), and a preset given on the command line
    replaces the config file's. vocab_size (it follows the tokenizer), dropout and bias override it without a word,
    and so does GPT-2's block_size (its presets leave it to the default, 1024). The shared names map onto LLaMA's:
    n_embd = dim, n_layer = n_layers, n_head = n_heads, block_size = max_seq_len, bias = attention and MLP biases."""

    arch: str = _key("gpt2", "gpt2 | llama3 | qwen3 | qwen3_moe | mixtral")
    pretrained: Optional[str] = _key(None, "start from a trained model: an HF directory (config.json + safetensors) "
                                           "or an llm.c .bin; the arch, shape and weights come from it (the other "
                                           "model keys but dropout stay unset); null: the seeded init")
    preset: Optional[str] = _key(None, "a preset of the arch (gpt2, gpt2-medium, d12, ...; llama3.2-1b, ...; "
                                       "qwen3-0.6b, qwen3-8b; qwen3-30b-a3b; mixtral-8x7b) or null")
    block_size: Optional[int] = _key(None, "longest sequence; null: the preset's, else the arch's default")
    vocab_size: Optional[int] = _key(None, "token ids (byte tokenizer: >= 257, gpt2: >= 50257); null: default")
    n_layer: Optional[int] = _key(None, "transformer blocks; null: default")
    n_head: Optional[int] = _key(None, "attention heads, dividing n_embd; null: default")
    n_embd: Optional[int] = _key(None, "embedding width; null: default")
    dropout: Optional[float] = _key(None, "dropout probability in [0, 1) (llama3: on attention probabilities); "
                                          "null: default")
    bias: Optional[bool] = _key(None, "biases in Linear (and GPT-2's LayerNorm); null: default")
    n_kv_head: Optional[int] = _key(None, "llama3: key/value heads, dividing n_head (grouped-query attention); null: "
                                          "the preset's, else n_head")
    intermediate_size: Optional[int] = _key(None, "llama3: SwiGLU hidden width; null: default")
    rope_theta: Optional[float] = _key(None, "llama3: rotary base; null: default (500000)")
    rope_scaling_factor: Optional[float] = _key(None, "llama3: llama3 rope scaling factor; 0: no scaling; null: the "
                                                      "preset's, or none without a preset (8 when another "
                                                      "rope_* scaling key is given)")
    rope_low_freq_factor: Optional[float] = _key(None, "llama3 rope scaling: low frequency factor; null: 1")
    rope_high_freq_factor: Optional[float] = _key(None, "llama3 rope scaling: high frequency factor; null: 4")
    rope_original_context: Optional[int] = _key(None, "llama3 rope scaling: original context; null: 8192")
    rms_norm_eps: Optional[float] = _key(None, "llama3: RMSNorm epsilon; null: default (1e-5)")
    tie_embeddings: Optional[bool] = _key(None, "llama3: output layer tied to the token embedding; null: default")
    head_dim: Optional[int] = _key(None, "llama3 and the archs on its blocks: width of one attention head (even); "
                                         "null: the preset's, else n_embd / n_head")
    num_experts: Optional[int] = _key(None, "qwen3_moe | mixtral: experts of each sparse layer; null: 128 | 8")
    num_experts_per_tok: Optional[int] = _key(None, "qwen3_moe | mixtral: experts each token is routed to (top-k); "
                                                    "null: 8 | 2")
    router_aux_loss_coef: Optional[float] = _key(None, "qwen3_moe | mixtral: weight of the load-balancing loss added "
                                                       "to the training loss; null: 0.001")
    moe_intermediate_size: Optional[int] = _key(None, "qwen3_moe: each expert's SwiGLU width (mixtral's experts are "
                                                      "intermediate_size wide); null: 768")
    norm_topk_prob: Optional[bool] = _key(None, "qwen3_moe: renormalise the chosen experts' weights (mixtral always "
                                                "does); null: false")
    decoder_sparse_step: Optional[int] = _key(None, "qwen3_moe: layer i is sparse when (i + 1) % step == 0; null: 1")
    mlp_only_layers: Optional[list] = _key(None, "qwen3_moe: indices of layers kept dense (a list); null: []")

    PRESET_KEYS = ("n_layer", "n_head", "n_embd", "n_kv_head", "intermediate_size", "block_size", "rope_theta",
                   "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context",
                   "rms_norm_eps", "tie_embeddings", "head_dim") + MOE_KEYS
    LLAMA_NAMES = {"n_embd": "dim", "n_layer": "n_layers", "n_head": "n_heads", "n_kv_head": "n_kv_heads",
                   "block_size": "max_seq_len",
                   "tie_embeddings": "tie_word_embeddings", "rope_scaling_factor": ("rope_scaling", "factor"),
                   "rope_low_freq_factor": ("rope_scaling", "low_freq_factor"),
                   "rope_high_freq_factor": ("rope_scaling", "high_freq_factor"),
                   "rope_original_context": ("rope_scaling", "original_max_position_embeddings")}
    ARCH_KEYS = ARCH_KEYS
    LLAMA_ONLY = tuple(ARCH_KEYS)  # every key GPT-2 has not

    def foreign_keys(self):
        """(key, value, the archs it belongs to) for each explicit key that the arch has not."""
        return [(k, getattr(self, k), archs) for k, archs in ARCH_KEYS.items()
                if getattr(self, k) is not None and self.arch not in archs]

    def overrides(self):
        """The explicit shared fields (GPT2Config's names)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("arch", "preset") + self.LLAMA_ONLY and getattr(self, f.name) is not None}

    def preset_overrides(self):
        """(key, the preset's value, the given value) for each explicit PRESET_KEYS entry that differs from the
        preset."""
        if not self.preset or self.preset not in self.presets():
            return []
        preset = self.presets()[self.preset]
        conflicts = []
        for key in self.PRESET_KEYS:
            given, theirs = getattr(self, key), self._preset_value(preset, key)
            if key == "rope_scaling_factor" and given == 0 and self.arch == "llama3":
                given = None if preset.get("rope_scaling") is None else given  # 0: no scaling
            if given is not None and theirs is not None and given != theirs:
                conflicts.append((key, theirs, given))
        return conflicts

    def _preset_value(self, preset, key):
        name = self.LLAMA_NAMES.get(key, key) if self.arch != "gpt2" else key
        if isinstance(name, tuple):
            return (preset.get(name[0]) or {}).get(name[1], 0 if key == "rope_scaling_factor" else None)
        return preset.get(name)

    def presets(self):
        """The presets of the arch: {name: its config class's fields}."""
        from ...models.gpt2.config import GPT2_PRESETS
        from ...models.registry import model_class

        return GPT2_PRESETS if self.arch == "gpt2" else model_class(self.arch)[1].presets()

    def shape_keys_given(self):
        """The explicit keys that a ``pretrained`` model's own config decides (every one but arch and dropout)."""
        return [f.name for f in dataclasses.fields(self)
                if f.name not in ("arch", "pretrained", "dropout") and getattr(self, f.name) is not None]

    def resolved(self):
        """A copy whose null keys, among those the arch has, hold the values the model is built with (the preset's,
        else the arch's defaults): what ``train.py --print-config`` shows; it loads back to the same model. With
        ``pretrained`` a plain copy (the pretrained model's config decides, and the keys stay unset)."""
        copy = dataclasses.replace(self)
        if self.pretrained:
            return copy
        built = self.to_model_config().to_dict()
        if self.arch != "gpt2":
            built.update({ours: built[theirs] for ours, theirs in self.LLAMA_NAMES.items() if isinstance(theirs, str)})
            scaling = built["rope_scaling"] or {"factor": 0.0}  # 0: no scaling
            built.update({ours: scaling.get(theirs[1]) for ours, theirs in self.LLAMA_NAMES.items()
                          if isinstance(theirs, tuple)})
            if built["attention_bias"] == built["mlp_bias"]:
                built["bias"] = built["attention_bias"]
        for f in dataclasses.fields(self):
            key = f.name
            if (key not in ("arch", "pretrained", "preset") and getattr(self, key) is None
                    and self.arch in ARCH_KEYS.get(key, (self.arch,)) and built.get(key) is not None):
                setattr(copy, key, built[key])
        return copy

    def to_model_config(self):
        """The resolved GPT2Config, or the LlamaConfig (subclass) of the arch; a ``pretrained`` model's own
        (dropout as given)."""
        if self.pretrained:
            from ...models.pretrained import pretrained_config

            config = pretrained_config(self.pretrained)[1]
            if self.dropout is not None:
                config = dataclasses.replace(config, dropout=self.dropout)
            return config
        if self.arch != "gpt2":
            return self.to_llama_config()
        return self.to_gpt2_config()

    def to_gpt2_config(self):
        """The resolved infini_train.models.gpt2.config.GPT2Config."""
        from ...models.gpt2.config import GPT2Config

        if self.preset:
            return GPT2Config.from_preset(self.preset, **self.overrides())
        return GPT2Config(**self.overrides())

    def to_llama_config(self):
        """The resolved infini_train.models.llama.config.LlamaConfig, or for the archs on LLaMA's blocks their
        subclass of it (the arch's own defaults and presets)."""
        from ...models.registry import model_class

        config_class = model_class(self.arch if self.arch != "gpt2" else "llama3")[1]
        names = {"n_embd": "dim", "n_layer": "n_layers", "n_head": "n_heads", "block_size": "max_seq_len",
                 "vocab_size": "vocab_size", "dropout": "dropout", "n_kv_head": "n_kv_heads",
                 "intermediate_size": "intermediate_size", "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps",
                 "tie_embeddings": "tie_word_embeddings", "head_dim": "head_dim",
                 **{key: key for key in MOE_KEYS}}
        fields = dict(config_class.presets()[self.preset]) if self.preset else {}
        if self.n_head is not None and self.n_kv_head is None and not self.preset:
            fields["n_kv_heads"] = self.n_head
        for ours, theirs in names.items():
            if getattr(self, ours) is not None:
                fields[theirs] = getattr(self, ours)
        if self.bias is not None:
            fields["attention_bias"] = fields["mlp_bias"] = self.bias
        if self.arch not in ("llama3", "gpt2"):  # (the llama3 rope scaling keys are llama3's)
            return config_class(**fields)
        scaling = fields.get("rope_scaling")  # without a preset none, as in transformers' LlamaConfig
        given = (self.rope_scaling_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                 self.rope_original_context)
        if self.rope_scaling_factor == 0:
            scaling = None
        elif scaling is not None or any(v is not None for v in given):
            scaling = dict(scaling or {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192})
            for key, value in (("factor", self.rope_scaling_factor), ("low_freq_factor", self.rope_low_freq_factor),
                               ("high_freq_factor", self.rope_high_freq_factor),
                               ("original_max_position_embeddings", self.rope_original_context)):
                if value is not None:
                    scaling[key] = value
        fields["rope_scaling"] = scaling
        return config_class(**fields)
