"""DeepSeek-V3: multi-head latent attention (MLA), dense SwiGLU MLPs in the first ``first_k_dense_replace`` layers and
DeepSeek-MoE layers after them (nn/moe_routing.py), on LLaMA's shell (embedding, rotary tables, final norm and head).
Module names are Hugging Face's DeepseekV3ForCausalLM checkpoint names (``model.layers.3.self_attn.kv_b_proj``).

MLA, per token: the query is q_proj(x), or q_b_proj(RMSNorm(q_a_proj(x))) with ``q_lora_rank``; each head's query
is its qk_nope_head_dim part and its qk_rope_head_dim part. kv_a_proj_with_mqa(x) gives the compressed latent
(kv_lora_rank, then RMSNorm) and one rope key shared by every head; kv_b_proj(latent) gives each head's k_nope and
v. The rotation (YaRN-scaled, DeepSeek's interleaved pairs as HF applies them) touches only the rope parts; the
softmax scale is qk_head_dim ** -0.5 times YaRN's mscale squared (models/yarn.py). The KV cache keeps the latent and
the rotated rope key per token (mla_cache.py), and the keys and values are expanded from it at each step, as HF
does."""
from __future__ import annotations


from ... import backend
from ..causal_lm import CausalLM
from ..llama.model import Llama
from ..moe_lm import MoECausalLM
from ..registry import ModelSpec, register
from .config import DeepseekV3Config
from .layers import (DeepseekV3Attention, DeepseekV3DecoderLayer, init_weights, latent_attention,  # noqa: F401
                     rotate)
from .mla_cache import MLACache


class DeepseekV3(MoECausalLM, Llama):
    """LLaMA's shell with DeepSeek-V3's blocks; the MoE bookkeeping is MoECausalLM's (expert-parallel counts, pipeline
    statistics, and the loss: cross-entropy plus, with seq_aux_loss_alpha, the sequence-wise balance loss of every
    MoE layer; no Switch load-balancing loss)."""

    CHUNK_ATTRIBUTES = Llama.CHUNK_ATTRIBUTES + ("_rope_factor", "mtp_loss_weight")
    mtp_loss_weight = 0.3  # train.mtp_loss_weight: the multi-token prediction loss's weight (mtp.py)
    mtp_loss = None  # the last training forward's MTP loss (before the weight), with num_nextn_predict_layers

    DECODER_LAYER = DeepseekV3DecoderLayer

    def __init__(self, config: DeepseekV3Config):
        CausalLM.__init__(self)
        self.build_shell(config)
        if config.num_nextn_predict_layers:  # multi-token prediction (mtp.py)
            from .mtp import build_mtp
            self.mtp = build_mtp(self)
        self._inv_freq, self._rope_factor = config.rope_parameters()
        self._rope_tables = {}

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        if "mtp" in self._modules and self.first and self.last:  # (a pipeline sets the tokens per micro-batch)
            from .mtp import input_tokens
            with input_tokens(idx):
                return super().forward(idx, targets, kv_cache, last_only)
        return super().forward(idx, targets, kv_cache, last_only)

    def head(self, x, targets=None, last_only=False):
        logits, loss = super().head(x, targets, last_only)
        if loss is not None and self.training and "mtp" in self._modules:  # x: before the final norm
            from .mtp import add_mtp_loss
            loss = add_mtp_loss(self, x, targets, loss)
        return logits, loss

    def pipeline_chunk(self, layers, first, last, head=None):
        chunk = super().pipeline_chunk(layers, first, last, head)
        if last and "mtp" in self._modules:
            from .mtp import attach_to_last_chunk
            attach_to_last_chunk(self, chunk, first)
        return chunk

    def shared_embedding_names(self):
        """(embedding, the last pipeline stage's copy) of an untied model with MTP modules, else None."""
        from .mtp import shared_embedding_names
        return shared_embedding_names(self)

    @property
    def reads_input_tokens(self):
        return "mtp" in self._modules  # (the MTP modules embed the shifted input tokens)

    def input_tokens(self, idx):
        from .mtp import input_tokens
        return input_tokens(idx)

    _init_weights = staticmethod(init_weights)  # HF's DeepseekV3PreTrainedModel's (layers.py)

    def kv_heads(self, block):
        attn = block.self_attn
        return attn.kv_b_proj.weight.shape[0] // (attn.nope + attn.v_dim)

    absorbed_decoding = False  # True: attention over the cache by weight absorption (absorbed_attention), not HF's

    def new_kv_cache(self, batch_size, device, dtype=backend.float32):
        """The compressed cache: per layer the latent and the rotated rope key of each token (mla_cache.py); with
        ``absorbed_decoding`` attention reads it without expanding the keys and values (HF expands them)."""
        return MLACache(self.config, batch_size, device, dtype, absorbed=self.absorbed_decoding)

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token: 6 x the active parameters (the routed experts a token is not sent to left out)
        + MLA's attention, 6 L H T (qk_head_dim + v_head_dim) (scores over qk_head_dim, values over v_head_dim)."""
        from ..flops import training_flops_per_token

        cfg = self.config
        seq = seq_len or cfg.context_length
        dense = training_flops_per_token(self, 0, 0, 0, seq, self.idle_params)
        total = dense + 6 * cfg.n_layers * cfg.n_heads * seq * (cfg.head_dim + cfg.v_head_dim)
        if "mtp" in self._modules:  # the multi-token prediction modules' own (mtp.py)
            from .mtp import mtp_flops_per_token
            total += mtp_flops_per_token(self, seq)
        return total

    # ---------------------------------------------------------------------------------------- weights
    @classmethod
    def config_from_hf(cls, hf, source):
        from .io import hf_config_to_deepseek_v3
        return hf_config_to_deepseek_v3(hf, source)

    def hf_config(self, dtype):
        from .io import deepseek_v3_to_hf_config
        return deepseek_v3_to_hf_config(self.config, dtype)

    def to_hf_name(self, name):
        from .io import mtp_to_hf_name
        return mtp_to_hf_name(name, self.config.n_layers)

    @classmethod
    def from_pretrained(cls, directory, device=None, dtype=None):
        """Load a Hugging Face DeepseekV3ForCausalLM directory (with its multi-token prediction layers, mtp.py)."""
        from .io import load_hf
        model = load_hf(cls, directory, dtype)
        return model.to(device) if device is not None else model


def _parallelize(model, group, sequence_parallel=False):
    from .parallel import parallelize_deepseek_v3

    return parallelize_deepseek_v3(model, group, sequence_parallel)


def _head_counts(config):
    return {"n_head": config.n_heads}


def read_hf(directory):
    from .io import hf_weights

    return hf_weights(directory, DeepseekV3)[:2]


SPEC = register(ModelSpec("deepseek_v3", DeepseekV3, DeepseekV3Config, _parallelize, _head_counts,
                          read_hf=read_hf))

__all__ = ["DeepseekV3", "DeepseekV3Attention", "DeepseekV3DecoderLayer", "latent_attention", "rotate", "SPEC"]
