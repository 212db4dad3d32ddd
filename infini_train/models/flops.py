"""Training FLOPs per token of a causal LM, PaLM's appendix B: 6 N + 12 L H Q T (N the parameters that multiply a
token, i.e. all but the position and untied token embeddings and, in a mixture of experts, the experts it is not
routed to; L layers, H heads of size Q, T tokens of context).

6 per parameter is forward (2), the input gradient (2) and the weight gradient (2). A frozen weight (LoRA's base)
gets no weight gradient: 4. The attention scores and their values cost 12 L H Q T whatever is frozen, since the
gradient still flows through them to the trainable parameters below."""
from __future__ import annotations


def training_flops_per_token(model, n_layer, n_head, head_dim, seq_len, idle=None):
    """``model``: has ``num_params(non_embedding=True, trainable=True | False)``; ``idle(trainable)``: of those, the
    parameters a token does not pass through (a mixture of experts' unchosen experts: N counts the active ones)."""
    idle = idle or (lambda trainable: 0)
    trainable = model.num_params(non_embedding=True, trainable=True) - idle(True)
    frozen = model.num_params(non_embedding=True, trainable=False) - idle(False)
    return 6 * trainable + 4 * frozen + 12 * n_layer * n_head * head_dim * seq_len
