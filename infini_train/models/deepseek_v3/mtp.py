"""DeepSeek-V3's multi-token prediction (MTP; the DeepSeek-V3 report, section 2.2, and Megatron-Core's
multi_token_prediction.py): ``num_nextn_predict_layers`` = D modules after the main model. Module k (1..D), at
position t, takes the previous depth's hidden state h^{k-1}_t (the main model's final hidden states before its final
norm for k = 1) and the shared embedding of token t + k, and predicts token t + 1 + k:

    h^k = Block_k(eh_proj([enorm(Emb(x_{t+k})), hnorm(h^{k-1}_t)]))      (eh_proj: 2 dim -> dim, no bias)
    logits^k = Head(shared_head.norm(h^k))                                 (Emb and Head: the model's own)

The block is a DeepSeek-V3 decoder layer of index N + k - 1 (N = num_hidden_layers: MLA and, past
first_k_dense_replace, a DeepSeek-MoE layer). As Megatron does, each depth rolls the input tokens and the targets
one more place to the left; the last k positions of depth k (of each document, for packed documents) have no target
(ignored). Training adds

    mtp_loss = mean over k of CE(logits^k, x_{t+1+k})     and     loss = main loss + mtp_loss_weight * mtp_loss

(``train.mtp_loss_weight``; the cross-entropies as the main loss's, token_loss.py). The modules run only in training
mode with targets; evaluation, validation and generation see the main model alone.

Names are those of DeepSeek's checkpoints: module k is ``model.layers.{N+k-1}`` there and ``mtp.{k-1}`` here, with
``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and the block's own names; ``embed_tokens`` and
``shared_head.head`` are the model's embedding and output layer (shared modules: they appear in the state dict under
these names too, as a tied weight does). In a pipeline the modules live on the last stage, which gets the input
tokens (``input_tokens``, set per micro-batch by PipelinedLM) and a copy of the embedding placed as a ``tied_copy``
(its gradient summed with the first stage's over the embedding group; a tied output layer's copy serves both). Under
tensor parallelism (parallel.py) the blocks split as the model's, the embedding and head are the vocab-parallel ones
(the MTP losses through the vocab-parallel cross-entropy), and with sequence parallelism the norms and eh_proj run on
each rank's slice."""
from __future__ import annotations

import contextlib
import threading

import numpy as np

from ... import backend
from ... import nn
from ...autograd.ops.joins import cat
from ...placement import place
from ...tensor import Tensor
from ..documents import active_layout
from ..token_loss import token_loss
from .layers import DeepseekV3DecoderLayer, init_weights

class _Tokens(threading.local):
    value = None


_tokens = _Tokens()


@contextlib.contextmanager
def input_tokens(idx):
    """Forwards inside see ``idx`` (B, T) as the batch's input tokens (the last pipeline stage's MTP modules read
    them; a whole model sets them itself)."""
    previous, _tokens.value = _tokens.value, idx
    try:
        yield
    finally:
        _tokens.value = previous


class SharedHead(nn.Module):
    """``norm`` (the module's own RMSNorm) and ``head`` (the model's output layer, shared)."""

    def __init__(self, config):
        super().__init__()
        self.norm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)


class MTPLayer(DeepseekV3DecoderLayer):
    """One MTP module: the decoder layer ``layer`` (= N + k - 1) with enorm, hnorm, eh_proj and shared_head.norm
    (``embed_tokens`` and ``shared_head.head`` are attached by ``build_mtp``)."""

    def __init__(self, config, layer):
        super().__init__(config, layer)
        self.layer = layer
        self.enorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)
        self.hnorm = nn.RMSNorm(config.dim, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.dim, config.dim, bias=False)
        self.shared_head = SharedHead(config)

    def forward(self, h, tokens, rope):
        """(h^k, logits^k) from h^{k-1} (B, T, dim; under sequence parallelism this rank's slice) and the shifted
        tokens (B, T)."""
        emb = self.embed_tokens(tokens)
        tp = self.self_attn.tp
        if tp is not None and tp.sequence_parallel:
            emb = tp.scatter_sequence(emb)
        if emb.dtype != h.dtype:
            emb = emb.to(h.dtype)
        x = self.eh_proj(cat([self.enorm(emb), self.hnorm(h)], -1))
        h = super().forward(x, rope, None, self.layer)
        return h, self.shared_head.head(self.shared_head.norm(h))


def build_mtp(model):
    """The model's D MTP modules (their own weights initialised as the model's), sharing its embedding and head."""
    config = model.config
    layers = nn.ModuleList([MTPLayer(config, config.n_layers + k) for k in range(config.num_nextn_predict_layers)])
    layers.apply(init_weights)
    share(layers, model.model.embed_tokens, model.lm_head)
    return layers


def share(layers, embedding, head):
    for layer in layers:
        layer.embed_tokens = embedding
        layer.shared_head.head = head


def parallelize_mtp(model, sequence_parallel):
    """Under tensor parallelism (parallel.py splits the blocks): the modules share the vocab-parallel embedding and
    head; with sequence parallelism their norms and eh_proj run on each rank's slice (gradients summed)."""
    share(model.mtp, model.model.embed_tokens, model.lm_head)
    if sequence_parallel:
        from ...nn.parallel import mark_sequence_parallel

        for layer in model.mtp:
            for module in (layer.enorm, layer.hnorm, layer.eh_proj, layer.shared_head.norm):
                mark_sequence_parallel(module)


def attach_to_last_chunk(model, chunk, first):
    """Give the last pipeline chunk the MTP modules; on a stage other than the first, their embedding is a copy of the
    model's (placed as a tied copy; a tied output layer's copy when the embedding is tied), vocab-parallel as the
    model's under tensor parallelism."""
    chunk.mtp = model.mtp
    if first:
        return
    source = model.model.embed_tokens
    if model.config.tie_word_embeddings:
        weight = chunk.lm_head.weight
    else:
        from ...nn.parallel.sharded_init import derived_from
        from ...nn.parallel.tensor_parallel import ParallelParameter

        whole = source.weight
        weight = ParallelParameter(Tensor._make(backend.copy_array(whole.array, whole.device), whole.device),
                                   requires_grad=whole.requires_grad)
        place(weight, tensor_shard=whole.placement.tensor_shard, tied_copy=True)
        if whole.device is backend.META:
            derived_from(weight, whole)
    if isinstance(source, nn.Embedding):
        embedding = nn.Embedding(*weight.shape, padding_idx=source.padding_idx, _weight=weight)
    else:  # a VocabParallelEmbedding: the same split over the copy
        embedding = type(source).__new__(type(source))
        nn.Module.__init__(embedding)
        for name in ("group", "num_embeddings", "embedding_dim", "pad_to_multiple_of", "padded_num_embeddings",
                     "num_embeddings_per_partition", "padding_idx"):
            setattr(embedding, name, getattr(source, name))
        embedding.weight = weight
    share(model.mtp, embedding, chunk.lm_head)


def shared_embedding_names(model):
    """The names of the embedding and of the last stage's copy for an untied model with MTP modules (else None)."""
    if "mtp" not in model._modules or model.config.tie_word_embeddings:
        return None
    return ("model.embed_tokens.weight", "mtp.0.embed_tokens.weight")


def mtp_flops_per_token(model, seq_len):
    """What the MTP modules add to the model's training FLOPs per token (its 6 N counts their parameters once, every
    expert and the output layer once): each module's attention 6 H T (qk_head_dim + v_head_dim), one more pass
    through the shared output layer (6 V dim), less the routed experts a token is not sent to."""
    cfg = model.config
    per = 6 * cfg.n_heads * seq_len * (cfg.head_dim + cfg.v_head_dim) + 6 * cfg.vocab_size * cfg.dim
    idle = 6 * (cfg.num_experts - cfg.num_experts_per_tok) * 3 * cfg.dim * cfg.moe_intermediate_size
    return sum(per - (idle if cfg.sparse_layer(layer.layer) else 0) for layer in model.mtp)


def _rolled(array, k, fill, device):
    xp = device.array_module()
    with device.context():
        out = xp.full_like(array, fill)
        out[:, :array.shape[1] - k] = array[:, k:]
    return Tensor._make(out, device)


def _within_documents(target, segments, k, device):
    T = segments.shape[1]
    same = np.zeros(segments.shape, bool)
    same[:, :T - k] = (segments[:, k:] == segments[:, :T - k]) & (segments[:, :T - k] != 0)
    keep = backend.to_device_array(same, device)
    xp = device.array_module()
    with device.context():
        return Tensor._make(xp.where(keep, target.array, -1), device)


def mtp_loss(model, hidden, targets):
    """The mean over the depths of the MTP cross-entropies (a 0-d Tensor), from the main model's hidden states before
    its final norm (B, T, dim) and its targets (B, T); the input tokens come from ``input_tokens``."""
    idx = _tokens.value
    if idx is None:
        raise RuntimeError("DeepseekV3: multi-token prediction needs the batch's input tokens on the last pipeline "
                           "stage (models.deepseek_v3.mtp.input_tokens)")
    device = hidden.device
    rope = model.block_args(hidden, None)
    tokens, labels, h, total = idx.array, targets.array, hidden, None
    layout = active_layout()
    for k, layer in enumerate(model.mtp, start=1):
        shifted = _rolled(tokens, k, 0, device)
        h, logits = layer(h, shifted, *rope)
        target = _rolled(labels, k, -1, device)
        if layout is not None:  # packed documents: no target from the next document (each computes as alone)
            target = _within_documents(target, layout.segments, k, device)
        if model.tp is not None:  # logits of this rank's part of the vocabulary
            _, loss = model.tp.logits_and_loss(logits, target, model.config.vocab_size)
        else:
            loss = token_loss(logits.view(-1, logits.shape[-1]), target.view(-1))
        total = loss if total is None else total + loss
    return total / len(model.mtp)


def add_mtp_loss(model, hidden, targets, loss):
    """``loss`` + mtp_loss_weight x the MTP loss, kept (detached) as ``model.mtp_loss``."""
    value = mtp_loss(model, hidden, targets)
    model.mtp_loss = value.detach()
    weight = model.mtp_loss_weight
    return loss + value.to(loss.dtype) * weight if weight else loss


__all__ = ["MTPLayer", "build_mtp", "mtp_flops_per_token", "input_tokens", "mtp_loss", "add_mtp_loss",
           "attach_to_last_chunk", "shared_embedding_names"]
