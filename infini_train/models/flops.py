"""Training FLOPs per token of a causal LM, PaLM's appendix B: 6 N + 12 L H Q T (N the parameters that multiply,
i.e. all but the position and untied token embeddings; L layers, H heads of size Q, T tokens of context).

6 per parameter is forward (2), the input gradient (2) and the weight gradient (2). A frozen weight (LoRA's base)
gets no weight gradient: 4. The attention scores and their values cost 12 L H Q T whatever is frozen, since the
gradient still flows through them to the trainable parameters below."""
from __future__ import annotations


def training_flops_per_token(model, n_layer, n_head, head_dim, seq_len):
    """``model``: has ``num_params(non_embedding=True, trainable=True | False)``."""
    trainable = model.num_params(non_embedding=True, trainable=True)
    frozen = model.num_params(non_embedding=True, trainable=False)
    return 6 * trainable + 4 * frozen + 12 * n_layer * n_head * head_dim * seq_len
