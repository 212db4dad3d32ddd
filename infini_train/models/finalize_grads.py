"""The gradient finaliser of a layout (Megatron's ``finalize_model_grads``): after a step's forward-backward one flat
list of steps brings every gradient to what the one-process run holds, and ``clip_grad_norm`` clips by the whole
model's norm. Each step does nothing where its layout is off.

What already happened during backward: DDP (ZeRO's reducer under ZeRO 1 and 2), around the model or each pipeline
chunk, averaged the replicated parameters' gradients over the data-parallel group; under ZeRO-3 fully_shard
reduce-scattered them into this rank's shards (the local experts' over their expert-data group, divided by the
data-parallel size). Then, in this order:

1. experts (expert parallelism): the local experts' gradients, left out of DDP, summed over the expert-data group and
   divided by the data-parallel size (under ZeRO 1 and 2 in the optimizer's expert spaces; ZeRO-2 reduce-scatters
   them into this rank's shard; nothing under ZeRO-3, whose units reduced them);
2. tied embedding (pipelines): the first stage's embedding and the last stage's copy summed over the embedding group
   (under ZeRO-3 their shards, which cover the same elements), or on the first stage itself in a V (zbv, dualpipev);
3. sequence parallelism: the layer norms' and row-parallel biases' gradients summed over the tensor group (under ZeRO,
   the pieces this rank owns; a mixture of experts' where any rank of the group got one);
4. ZeRO-2 under pipelines: the whole gradients, kept through the schedule, reduce-scattered over the data group;
5. DeepSeek-MoE routers (auxiliary-loss-free balance): each e_score_correction_bias moved by its rate against the
   step's expert loads summed over the ranks (models/expert_bias.py; not a gradient, and not the optimizer's).

Clipping: ZeRO's norm over every rank's shard (each element, every expert included, owned by one rank), the norm
counting every expert once (expert parallelism), the model-parallel norm over a mesh, or the plain norm.
"""
from __future__ import annotations

from ..nn.parallel.grad_norm import clip_grad_norm_model_parallel_
from ..nn.parallel.tensor_parallel import all_reduce_grads, all_reduce_grads_where_any
from ..nn.utils import clip_grad_norm_
from .expert_bias import update_expert_biases


def reduce_expert_grads(layout):
    if layout.experts is not None:
        layout.experts.reduce_grads(layout.optimizer if layout.zero_stage else None, shard=layout.zero_stage == 2,
                                    fully_sharded=layout.zero_stage == 3)


def sum_tied_embedding_grads(layout):
    dims = layout.dims
    if not dims.pipeline_parallel:
        return
    shared = layout.raw_model.shared_embedding_params()
    owned = layout.zero_stage == 3
    if layout.raw_model.shared_on_one_stage:  # a V: the embedding and its copies all live on the first stage
        copies = [_grads(layout, lambda p, q=q: p is q, owned) for q in shared]
        for pieces in zip(*copies) if len(copies) > 1 else ():  # the same elements of each copy
            total = pieces[0].array + pieces[1].array
            for g in pieces[2:]:
                total = total + g.array
            for g in pieces:
                g.array[...] = total
                g._version[0] += 1
    elif dims.embedding_group is not None:
        ids = {id(p) for p in shared}
        all_reduce_grads(_grads(layout, lambda p: id(p) in ids, owned), dims.embedding_group)


def sum_sequence_parallel_grads(layout):
    if not layout.dims.sequence_parallel:
        return
    owned = layout.zero_stage == 3 if layout.dims.pipeline_parallel else bool(layout.zero_stage)
    if layout.moe and not owned:  # an expert may have got tokens on some ranks of the group only
        all_reduce_grads_where_any([p for p in layout.params if _sequence_parallel(p)], layout.dims.tp_group)
    else:
        all_reduce_grads(_grads(layout, _sequence_parallel, owned), layout.dims.tp_group)


def reduce_scatter_after_pipeline(layout):
    dims = layout.dims
    if dims.pipeline_parallel and dims.grad_size > 1 and layout.zero_stage == 2:
        layout.optimizer.reduce_gradients(shard=True)


def update_correction_biases(layout):
    if layout.moe:  # (a DeepSeek-MoE model's routers' biases; nothing for other models)
        update_expert_biases(layout.raw_model, layout.dims)


FINALIZE_STEPS = (reduce_expert_grads, sum_tied_embedding_grads, sum_sequence_parallel_grads,
                  reduce_scatter_after_pipeline, update_correction_biases)


def finalize_model_grads(layout):
    """Run every step of FINALIZE_STEPS for ``layout`` (a TrainingLayout), in order."""
    for step in FINALIZE_STEPS:
        step(layout)


def clip_grad_norm(layout, max_norm):
    """Clip by the whole model's gradient norm; returns it as a float."""
    dims = layout.dims
    if layout.zero_stage:  # the norm over every data-parallel rank's shard (each expert's owned by one of them)
        return float(layout.optimizer.clip_grad_norm_(max_norm, tensor_group=dims.tp_group,
                                                      pipeline_group=dims.pp_group).item())
    if layout.experts is not None:
        return float(clip_grad_norm_model_parallel_(layout.params, max_norm, dims.tp_group, dims.pp_group,
                                                    expert_group=layout.experts.expert_group).item())
    if dims.mesh is not None:
        return float(clip_grad_norm_model_parallel_(layout.params, max_norm, dims.tp_group, dims.pp_group).item())
    return float(clip_grad_norm_(layout.params, max_norm).item())


def _grads(layout, which, owned):
    """The gradients of the parameters ``which(p)`` picks: whole, or (``owned``) the pieces of them this rank's ZeRO
    shards hold (under ZeRO-3 only those exist)."""
    if owned:
        return [g for p, g in layout.optimizer.owned_grads() if which(p)]
    return [p.grad for p in layout.params if which(p) and p.grad is not None]


def _sequence_parallel(p):
    return p.placement.sequence_parallel


__all__ = ["FINALIZE_STEPS", "finalize_model_grads", "clip_grad_norm", "reduce_expert_grads",
           "sum_tied_embedding_grads", "sum_sequence_parallel_grads", "reduce_scatter_after_pipeline",
           "update_correction_biases"]
