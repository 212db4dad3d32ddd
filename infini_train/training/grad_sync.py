"""The one owner of gradient synchronisation for a run's layout (as Megatron's finalize_model_grads): after the
forward-backward of a step, ``finish()`` sums the gradients of tensors that live on several ranks and averages
over the data-parallel group where no DDP did during backward; ``clip(max_norm)`` clips by the whole model's norm.

Everything is decided when the run is built, from the layout and the ZeRO stage. DDP (ZeRO's reducer under ZeRO
1 and 2) around the model, or around each pipeline chunk, averaged the gradients over the data-parallel group
during backward (training/loop.py: wrap_data_parallel); then
- pipeline runs: the tied embedding's copies are summed over the embedding group (first and last stage), the
  sequence-parallel parameters over the tensor group; under ZeRO-2 the whole gradients are reduce-scattered over
  the data-parallel group only now (as Megatron-LM's distributed optimizer does);
- other runs: with sequence parallelism the layer norms' and row-parallel biases' gradients are summed over the
  tensor group (under ZeRO, the pieces this rank owns);
- ZeRO-3: fully_shard reduce-scattered the gradients during backward; the sums above run on this rank's shards
  (the tied embedding and its last-stage copy are units of their own, so their shards cover the same elements);
- expert-parallel runs: the local experts' gradients (left out of DDP) summed over the expert-data group and divided
  by the data-parallel size (training/expert_run.py); under ZeRO-2 reduce-scattered into the experts' shards;
- clipping: ZeRO's norm over every rank's shard (every expert counted once: each element is owned by one rank), the
  model-parallel norm over a mesh, the norm with every expert counted once (expert parallelism), or the plain norm.
"""
from __future__ import annotations

from ..nn.parallel.grad_norm import clip_grad_norm_model_parallel_
from ..nn.moe import MoE
from ..nn.parallel.tensor_parallel import all_reduce_grads, all_reduce_grads_where_any
from ..nn.utils import clip_grad_norm_


class GradientSync:
    def __init__(self, dims, model, optimizer, zero_stage=0):
        self.dims, self.model, self.optimizer = dims, model, optimizer
        self.zero_stage = zero_stage
        self.params = list(model.parameters())
        self.moe = any(isinstance(m, MoE) for m in model.modules())  # some parameters may get no gradient
        self.experts = None  # an ExpertParallelRun: the experts' gradients reduced and their norm counted once

    def finish(self):
        dims = self.dims
        if self.experts is not None:
            self.experts.finish(self.optimizer if self.zero_stage else None, shard=self.zero_stage == 2)
        if dims.pipeline_parallel:
            if dims.embedding_group is not None:
                shared = {id(p) for p in self.model.shared_embedding_params()}
                all_reduce_grads(self._grads(lambda p: id(p) in shared, owned=self.zero_stage == 3),
                                 dims.embedding_group)
            if dims.sequence_parallel:
                self._sum_sequence_parallel(owned=self.zero_stage == 3)
            if dims.grad_size > 1 and self.zero_stage == 2:  # reduce-scattered once the schedule is done
                self.optimizer.reduce_gradients(shard=True)
        elif dims.sequence_parallel:
            self._sum_sequence_parallel(owned=bool(self.zero_stage))

    def _sum_sequence_parallel(self, owned):
        """Sum the sequence-parallel parameters' gradients over the tensor group (a mixture of experts' too: an
        expert may have got tokens on some ranks of the group only)."""
        if self.moe and not owned:
            all_reduce_grads_where_any([p for p in self.params if _sequence_parallel(p)], self.dims.tp_group)
        else:
            all_reduce_grads(self._grads(_sequence_parallel, owned), self.dims.tp_group)

    def _grads(self, which, owned):
        """The gradients of the parameters ``which(p)`` picks: whole, or (``owned``) the pieces of them this rank's
        ZeRO shards hold (under ZeRO-3 only those exist)."""
        if owned:
            return [g for p, g in self.optimizer.owned_grads() if which(p)]
        return [p.grad for p in self.params if which(p) and p.grad is not None]

    def clip(self, max_norm):
        """Clip by the whole model's gradient norm; returns it as a float."""
        dims = self.dims
        if self.zero_stage:  # the norm over every data-parallel rank's shard (each expert's owned by one of them)
            return float(self.optimizer.clip_grad_norm_(max_norm, tensor_group=dims.tp_group,
                                                        pipeline_group=dims.pp_group).item())
        if self.experts is not None:
            return self.experts.clip(max_norm)
        if dims.mesh is not None:
            return float(clip_grad_norm_model_parallel_(self.params, max_norm, dims.tp_group,
                                                        dims.pp_group).item())
        return float(clip_grad_norm_(self.params, max_norm).item())


def _sequence_parallel(p):
    return getattr(p, "sequence_parallel", False)


__all__ = ["GradientSync"]
