"""What the mixture-of-experts causal LMs (Qwen3-MoE, Mixtral) add to LLaMA's shell: the sparse blocks' MLP is an
``it.nn.MoE`` (llama.build_mlp, where ``config.sparse_layer(layer)``), and the training loss carries Hugging Face's
auxiliary load-balancing loss: ``loss = cross_entropy + router_aux_loss_coef * aux_loss``, where ``aux_loss`` is
``load_balancing_loss_func`` over the router logits of all sparse layers at once (concatenated: one loss over every
layer's tokens, not the mean of per-layer losses), as ``*ForCausalLM`` computes with ``output_router_logits``.

Tensor parallelism of the experts, pipeline stages (the loss spans every layer's routers) and block recomputation
are refused with a clear error for now."""
from __future__ import annotations


from .. import nn
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.misc import cat
from ..nn.moe import load_balancing_loss

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
    return load_balancing_loss(cat(list(router_probs), 0), sum(routed_counts))


class MoECausalLM:
    """Mixed in before Llama: the loss with the auxiliary loss. ``aux_loss`` holds the last loss-computing forward's
    load-balancing loss (a 0-d Tensor, before the coefficient)."""

    aux_loss = None

    def moe_layers(self):
        """The MoE layers of the blocks this module runs, in layer order."""
        return [block.mlp for _, block in self.numbered_blocks() if isinstance(block.mlp, nn.MoE)]

    def run_blocks(self, x, kv_cache=None):
        if self.recompute == "block" and is_grad_enabled():
            raise NotImplementedError(f"train.recompute=block: not supported for {type(self).__name__} yet (the "
                                      "auxiliary loss reads every MoE layer's router logits from the forward)\n"
                                      "HINT: use train.recompute=none")
        return super().run_blocks(x, kv_cache)

    def head(self, x, targets=None, last_only=False):
        logits, loss = super().head(x, targets, last_only)
        layers = self.moe_layers() if loss is not None else []
        if layers:
            cfg = self.config
            self.aux_loss = load_balancing_loss_over_layers([m.router_probs for m in layers],
                                                            [m.routed_counts for m in layers])
            if cfg.router_aux_loss_coef:
                loss = loss + self.aux_loss.to(loss.dtype) * cfg.router_aux_loss_coef
        return logits, loss


def parallelize_moe(model, group, sequence_parallel=False):
    """Tensor parallelism is not supported for the MoE models yet (a one-rank group is a no-op)."""
    if group.size > 1:
        raise ValueError(f"parallel.tensor: tensor parallelism of {type(model).__name__}'s experts is not supported "
                         f"yet, got a tensor group of {group.size}\nHINT: use parallel.tensor=1")
    return model


def moe_layout_problems(config, tensor=1, pipeline=1, virtual=1):
    problems = []
    if tensor > 1:
        problems.append(f"parallel.tensor: expected 1 for a mixture-of-experts model (expert tensor parallelism is "
                        f"not supported yet), got {tensor}")
    if pipeline * virtual > 1:
        problems.append(f"parallel.pipeline: expected 1 for a mixture-of-experts model (the auxiliary loss spans "
                        f"every layer's routers), got {pipeline} x {virtual} stages")
    return problems


__all__ = ["MoECausalLM", "load_balancing_loss_over_layers", "check_moe_config", "parallelize_moe",
           "moe_layout_problems", "MOE_FIELDS"]
