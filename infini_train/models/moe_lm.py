"""What the mixture-of-experts causal LMs (Qwen3-MoE, Mixtral) add to LLaMA's shell: the sparse blocks' MLP is an
``it.nn.MoE`` (llama.build_mlp, where ``config.sparse_layer(layer)``), and the training loss carries Hugging Face's
auxiliary load-balancing loss: ``loss = cross_entropy + router_aux_loss_coef * aux_loss``, where ``aux_loss`` is
``load_balancing_loss_func`` over the router logits of all sparse layers at once (concatenated: one loss over every
layer's tokens, not the mean of per-layer losses), as ``*ForCausalLM`` computes with ``output_router_logits``.

Pipeline stages pass the router statistics on (MoECausalLM); under tensor parallelism the attention is split and
the experts stay whole on every rank (llama/parallel.py), and with sequence parallelism the loss pools the router
statistics of the group's slices. Block recomputation is refused with a clear error for now."""
from __future__ import annotations

import numpy as np

from .. import backend
from .. import nn
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.ops.joins import cat
from ..creation import zeros
from ..nn.moe import load_balancing_loss_from_statistics, router_statistics
from ..nn.moe_routing import sequence_balance_loss
from ..nn.parallel.mappings import reduce_from_tensor_parallel_region
from ..promotion import promote_types
from .documents import active_layout

MOE_FIELDS = ("num_experts", "num_experts_per_tok", "router_aux_loss_coef")


def check_moe_config(cfg):
    """Errors in a MoE config's expert fields (raised as ValueError, as LlamaConfig does)."""
    name = type(cfg).__name__
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}.{field}: expected a positive integer, got {value!r}")
    if cfg.num_experts_per_tok > cfg.num_experts:
        raise ValueError(f"{name}.num_experts_per_tok: expected at most num_experts ({cfg.num_experts}), got "
                         f"{cfg.num_experts_per_tok}")
    if not cfg.router_aux_loss_coef >= 0:
        raise ValueError(f"{name}.router_aux_loss_coef: expected a number >= 0, got {cfg.router_aux_loss_coef!r}")


def load_balancing_loss_over_layers(router_probs, routed_counts):
    """HF's load_balancing_loss_func (no attention mask) over every sparse layer at once: the layers' router
    probabilities (N, E) concatenated and their top-k assignment counts summed, one loss as if one router had routed
    every layer's rows (not the mean of per-layer losses). The layers computed both in their forward
    (``MoE.router_probs``, ``MoE.routed_counts``)."""
    return load_balancing_loss_from_statistics(router_statistics(list(router_probs), list(routed_counts)),
                                               int(router_probs[0].shape[1]))


class MoECausalLM:
    """Mixed in before Llama: the loss with the auxiliary loss. ``aux_loss`` holds the last loss-computing forward's
    load-balancing loss (a 0-d Tensor, before the coefficient).

    DeepSeek-MoE models (a config with ``seq_aux_loss_alpha``; nn/moe_routing.py's layers) have no Switch loss: their
    loss adds ``seq_aux_loss_alpha`` times the sum over the MoE layers of each layer's sequence-wise balance loss, and
    ``aux_loss`` holds that sum (before alpha; None when alpha is 0); their routers' correction biases are updated
    after each step (models/expert_bias.py).

    Split into pipeline chunks, the loss still pools every sparse layer's rows: a chunk passes the next its hidden
    states and the router statistics of the sparse layers so far (``pipeline_extras``: one more activation part),
    whose gradient comes back with the hidden states' -- the earlier stages' routers get the same gradient as in one
    process."""

    aux_loss = None
    _earlier = None  # the router statistics of the earlier pipeline chunks' sparse layers (None: first chunk)

    def moe_layers(self):
        """The MoE layers of the blocks this module runs, in layer order."""
        return [block.mlp for _, block in self.numbered_blocks() if isinstance(block.mlp, nn.MoE)]

    def num_params(self, non_embedding=False, trainable=None):
        """The whole model's parameters: under expert parallelism the local experts of a layer count for all of its
        experts (every rank of the expert group holds as many)."""
        count = super().num_params(non_embedding, trainable)
        for moe in self.moe_layers():
            local = [p for p in moe.experts.parameters() if trainable is None or p.requires_grad == trainable]
            count += sum(p.numel() for p in local) * (moe.num_experts - len(moe.experts)) // len(moe.experts)
        return count

    def idle_params(self, trainable):
        """The experts a token is not routed to: (num_experts - num_experts_per_tok) SwiGLUs of every sparse layer
        (from the config, so a pipeline chunk gives the whole model's), counted where the experts are ``trainable``
        (LoRA freezes them)."""
        cfg = self.config
        experts = [p for m in self.moe_layers() for p in m.experts.parameters()]
        frozen = bool(experts) and not experts[0].requires_grad  # (a chunk without experts: counted as trainable)
        if frozen == trainable:
            return 0
        sparse = sum(1 for layer in range(cfg.n_layers) if cfg.sparse_layer(layer))
        return sparse * (cfg.num_experts - cfg.num_experts_per_tok) * 3 * cfg.dim * cfg.moe_intermediate_size

    @property
    def sequence_balanced(self):
        """A DeepSeek-MoE model: the sequence-wise balance loss (weight ``seq_aux_loss_alpha``) instead of Switch's."""
        return hasattr(self.config, "seq_aux_loss_alpha")

    def pipeline_extras(self, dtype):
        """The router statistics passed between pipeline chunks: (2 E + 1,), and with a sequence-wise balance loss one
        more entry, the sum of the earlier layers' losses."""
        extra = 1 if self.sequence_balanced and self.config.seq_aux_loss_alpha else 0
        return [((2 * self.config.num_experts + 1 + extra,), promote_types(np.dtype("float32"), dtype))]

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """A pipeline chunk after the first takes (hidden states, router statistics so far), and one before the last
        returns them with its own sparse layers' added; a whole model is CausalLM's."""
        if not self.first:
            idx, self._earlier = idx
        out = super().forward(idx, targets, kv_cache, last_only)
        return out if self.last else (out, self.router_statistics())

    def router_statistics(self):
        """router_statistics of the sparse layers up to this chunk's last (this chunk's, plus the earlier ones')."""
        layers = self.moe_layers()
        if not layers:
            return self._earlier if self._earlier is not None else self._no_statistics()
        own = router_statistics([m.router_probs for m in layers], [m.routed_counts for m in layers],
                                self._rows_kept(layers[0]), [m.router_indices for m in layers])
        if self.sequence_balanced and self.config.seq_aux_loss_alpha:
            # under sequence parallelism each rank's part over its slices, the counts over the whole sequences: the
            # parts sum to the loss over the group (head's reduction)
            group = self.tp.group if self.tp is not None and self.tp.sequence_parallel else None
            seq = None
            for m in layers:
                part = sequence_balance_loss(m.router_probs, m.router_indices, m.sequences, m.top_k, group)
                seq = part.to(own.dtype) if seq is None else seq + part.to(own.dtype)
            own = cat([own, seq.reshape(1)], 0)
        return own if self._earlier is None else own + self._earlier

    def _rows_kept(self, layer):
        """For packed documents, which of the rows the layers routed are not padding (None: every row counts):
        the layout's (B, T) in row order, this rank's slice of the sequence under sequence parallelism."""
        layout = active_layout()
        if layout is None:
            return None
        segments = layout.segments
        tp = self.tp
        if tp is not None and tp.sequence_parallel:
            length = segments.shape[1] // tp.size
            segments = segments[:, tp.rank * length:(tp.rank + 1) * length]
        return backend.to_device_array(np.ascontiguousarray(segments.reshape(-1) != 0), layer.router_probs.device)

    def _no_statistics(self):
        (shape, dtype), = self.pipeline_extras(next(iter(self.parameters())).dtype)
        return zeros(*shape, dtype=dtype, device=next(iter(self.parameters())).device)

    def run_blocks(self, x, kv_cache=None):
        if self.recompute == "block" and is_grad_enabled():
            raise NotImplementedError(f"train.recompute=block: not supported for {type(self).__name__} yet (the "
                                      "auxiliary loss reads every MoE layer's router logits from the forward)\n"
                                      "HINT: use train.recompute=none")
        return super().run_blocks(x, kv_cache)

    def head(self, x, targets=None, last_only=False):
        logits, loss = super().head(x, targets, last_only)
        if loss is not None:
            cfg = self.config
            stats = self.router_statistics()
            if self.tp is not None and self.tp.sequence_parallel:  # each rank routed its slice of the sequence
                stats = reduce_from_tensor_parallel_region(stats, self.tp.group)
            if self.sequence_balanced:
                alpha = cfg.seq_aux_loss_alpha
                self.aux_loss = stats[-1] if alpha else None
                if alpha:
                    loss = loss + self.aux_loss.to(loss.dtype) * alpha
            else:
                self.aux_loss = load_balancing_loss_from_statistics(stats, cfg.num_experts)
                if cfg.router_aux_loss_coef:
                    loss = loss + self.aux_loss.to(loss.dtype) * cfg.router_aux_loss_coef
        return logits, loss


def moe_chunks(model):
    """The mixture-of-experts modules ``model`` runs: itself, or the chunks of this pipeline stage (a PipelinedLM);
    [] for a dense model."""
    from .pipeline_lm import stage_chunks  # (pipeline_lm sits above the model classes)

    return [c for c in stage_chunks(model) if isinstance(c, MoECausalLM)]


__all__ = ["MoECausalLM", "load_balancing_loss_over_layers", "check_moe_config", "moe_chunks", "MOE_FIELDS"]
