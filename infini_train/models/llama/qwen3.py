"""Qwen3: LLaMA's blocks with an RMSNorm over each head's queries and keys (``q_norm``, ``k_norm``, before the
rotation), a ``head_dim`` of its own (not dim / heads) and no attention bias; embeddings may be tied. The model is
Llama with ``Qwen3Config`` (whose ``qk_norm`` is on); only the HF config.json differs. Module names are HF's
Qwen3ForCausalLM names, so its directories load as they are."""
from __future__ import annotations

from dataclasses import dataclass

from ..gpt2.io import WeightsError
from ..registry import ModelSpec, register
from .model import Llama, _head_counts, read_hf
from .config import LlamaConfig


QWEN3_PRESETS = {  # the released shapes (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B)
    "qwen3-0.6b": dict(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936, max_seq_len=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True),
    "qwen3-8b": dict(dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, intermediate_size=12288,
                     vocab_size=151936, max_seq_len=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                     tie_word_embeddings=False),
}


@dataclass
class Qwen3Config(LlamaConfig):
    """LlamaConfig's fields (``head_dim`` given explicitly in Qwen3's checkpoints) plus ``qk_norm`` (True); rope
    scaling is off and rope_theta 1e6, as the released models."""

    vocab_size: int = 151936
    rope_theta: float = 1000000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qk_norm: bool = True

    @classmethod
    def presets(cls):
        return QWEN3_PRESETS


def check_sliding_window(hf, source):
    """Sliding-window attention is not supported: refuse configs that would use it (a window as long as the context is
    full attention)."""
    window = hf.get("sliding_window")
    used = hf.get("use_sliding_window", True) and window is not None
    if used and window < hf.get("max_position_embeddings", 2048):
        raise WeightsError(f"{source}: sliding_window {window} (< max_position_embeddings) is not supported\n"
                           "HINT: set use_sliding_window false or sliding_window null for full causal attention")


def qwen3_to_hf_config(cfg, dtype, model_type="qwen3", architecture="Qwen3ForCausalLM"):
    from .io import llama_to_hf_config

    hf = llama_to_hf_config(cfg, dtype)
    hf.pop("mlp_bias")
    hf.update(architectures=[architecture], model_type=model_type, use_sliding_window=False, sliding_window=None,
              max_window_layers=cfg.n_layers)
    return hf


class Qwen3(Llama):
    @classmethod
    def config_from_hf(cls, hf, source):
        from .io import llama_config_fields

        check_sliding_window(hf, source)
        return Qwen3Config(**llama_config_fields(hf, source, "qwen3"))

    def hf_config(self, dtype):
        return qwen3_to_hf_config(self.config, dtype)


def parallelize_qwen3(model, group, sequence_parallel=False):
    """LLaMA's tensor-parallel plan; the per-head q_norm / k_norm weights are replicated and, as every rank sees only
    its heads, their gradients are summed over the tensor group (the sequence-parallel sum), so that needs
    ``parallel.sequence``."""
    from ...autograd.grad_mode import no_grad
    from ...nn.parallel import mark_sequence_parallel
    from .parallel import parallelize_llama

    if group.size > 1 and not sequence_parallel:
        raise ValueError(f"parallel.tensor: {type(model).__name__} under tensor parallelism needs "
                         "parallel.sequence=true (the gradients of the per-head q_norm / k_norm weights are partial "
                         "sums over the tensor group, which the sequence-parallel gradient sum completes)\nHINT: add "
                         "parallel.sequence=true")
    parallelize_llama(model, group, sequence_parallel)
    if group.size > 1:
        with no_grad():
            for block in model.model.layers:
                mark_sequence_parallel(block.self_attn.q_norm)
                mark_sequence_parallel(block.self_attn.k_norm)
    return model


def qk_norm_layout(arch):
    """The layout problems of ``arch``'s per-head q_norm / k_norm (ModelSpec.layout_problems): under tensor
    parallelism their gradients need the sequence-parallel sum (parallelize_qwen3)."""
    def problems(config, tensor, pipeline, virtual, sequence):
        if tensor > 1 and sequence is False:
            return [f"parallel.sequence: expected true for model.arch={arch} with parallel.tensor={tensor} (the "
                    "gradients of the per-head q_norm / k_norm weights are partial sums over the tensor group, which "
                    "the sequence-parallel gradient sum completes), got false; HINT: add parallel.sequence=true"]
        return []

    return problems


SPEC = register(ModelSpec("qwen3", Qwen3, Qwen3Config, parallelize_qwen3, _head_counts, qk_norm_layout("qwen3"),
                          read_hf=read_hf))

__all__ = ["Qwen3", "Qwen3Config", "QWEN3_PRESETS", "SPEC", "check_sliding_window", "qwen3_to_hf_config",
           "qk_norm_layout"]
