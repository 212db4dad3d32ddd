"""The ``model`` section of a run config: the architecture (gpt2 | llama3), a preset and explicit fields, resolved
into a GPT2Config or LlamaConfig; and ``_key``, the field helper every section uses."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional


def _key(default, doc):
    """A setting whose one-line ``doc`` ``train.py --help`` lists beside its dotted key."""
    return field(default=default, metadata={"doc": doc})


@dataclass
class ModelConfig:
    """The model: ``arch`` gpt2 (GPT2Config) or llama3 (LlamaConfig), a preset of that arch (GPT2_PRESETS: gpt2,
    d12, ...; LLAMA_PRESETS: llama3.2-1b, ...) and/or explicit fields. Explicit (non-null) fields override the
    preset, and without a preset the arch's defaults. The preset defines the architecture (PRESET_KEYS: the shape and
    context, and for llama3 the rope, norm and tying settings): an explicit one that differs from the preset's is
    reported (``preset_overrides``; the run prints a warning for each), and a preset given on the command line
    replaces the config file's. vocab_size (it follows the tokenizer), dropout and bias override it without a word,
    and so does GPT-2's block_size (its presets leave it to the default, 1024). The shared names map onto LLaMA's:
    n_embd = dim, n_layer = n_layers, n_head = n_heads, block_size = max_seq_len, bias = attention and MLP biases."""

    arch: str = _key("gpt2", "gpt2 | llama3")
    preset: Optional[str] = _key(None, "a preset of the arch (gpt2, gpt2-medium, d12, ...; llama3.2-1b, ...) or null")
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

    PRESET_KEYS = ("n_layer", "n_head", "n_embd", "n_kv_head", "intermediate_size", "block_size", "rope_theta",
                   "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_context",
                   "rms_norm_eps", "tie_embeddings")
    LLAMA_NAMES = {"n_embd": "dim", "n_layer": "n_layers", "n_head": "n_heads", "n_kv_head": "n_kv_heads",
                   "block_size": "max_seq_len",
                   "tie_embeddings": "tie_word_embeddings", "rope_scaling_factor": ("rope_scaling", "factor"),
                   "rope_low_freq_factor": ("rope_scaling", "low_freq_factor"),
                   "rope_high_freq_factor": ("rope_scaling", "high_freq_factor"),
                   "rope_original_context": ("rope_scaling", "original_max_position_embeddings")}
    LLAMA_ONLY = ("n_kv_head", "intermediate_size", "rope_theta", "rope_scaling_factor", "rope_low_freq_factor",
                  "rope_high_freq_factor", "rope_original_context", "rms_norm_eps", "tie_embeddings")

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
        name = self.LLAMA_NAMES.get(key, key) if self.arch == "llama3" else key
        if isinstance(name, tuple):
            return (preset.get(name[0]) or {}).get(name[1], 0 if key == "rope_scaling_factor" else None)
        return preset.get(name)

    def presets(self):
        from ..models.gpt2_config import GPT2_PRESETS
        from ..models.llama_config import LLAMA_PRESETS

        return LLAMA_PRESETS if self.arch == "llama3" else GPT2_PRESETS

    def to_model_config(self):
        """The resolved GPT2Config or LlamaConfig."""
        if self.arch == "llama3":
            return self.to_llama_config()
        return self.to_gpt2_config()

    def to_gpt2_config(self):
        """The resolved infini_train.models.gpt2_config.GPT2Config."""
        from ..models.gpt2_config import GPT2Config

        if self.preset:
            return GPT2Config.from_preset(self.preset, **self.overrides())
        return GPT2Config(**self.overrides())

    def to_llama_config(self):
        """The resolved infini_train.models.llama_config.LlamaConfig."""
        from ..models.llama_config import LLAMA_PRESETS, LlamaConfig

        names = {"n_embd": "dim", "n_layer": "n_layers", "n_head": "n_heads", "block_size": "max_seq_len",
                 "vocab_size": "vocab_size", "dropout": "dropout", "n_kv_head": "n_kv_heads",
                 "intermediate_size": "intermediate_size", "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps",
                 "tie_embeddings": "tie_word_embeddings"}
        fields = dict(LLAMA_PRESETS[self.preset]) if self.preset else {}
        if self.n_head is not None and self.n_kv_head is None and not self.preset:
            fields["n_kv_heads"] = self.n_head
        for ours, theirs in names.items():
            if getattr(self, ours) is not None:
                fields[theirs] = getattr(self, ours)
        if self.bias is not None:
            fields["attention_bias"] = fields["mlp_bias"] = self.bias
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
        return LlamaConfig(**fields)
