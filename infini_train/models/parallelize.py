"""A model's layout plan, built once (torchtitan's ``parallelize_fn`` on its TrainSpec). ``spec.parallelize(model,
dims, cfg)`` applies every layout the run's ``dims`` and config ask for to a causal LM built on the meta device (its
init calls recorded), in one declared order, and returns the ParallelPlan. Once the run has given the model storage
and values, ``plan.train(cfg.train)`` builds what the steps need -- the optimizer, the data-parallel wrapping, the
gradient finaliser and clipping, and the RunState its checkpoints go through -- as one TrainingLayout.

The order, each step doing nothing where its layout is off:
  1. tensor / sequence parallelism: the spec's tensor plan splits attention heads, MLPs and the vocabulary;
  2. LoRA: adapters on the target layers after the split (the adapters of split layers are split too, and their
     init is recorded after the model's);
  3. pipeline stages: this stage's model chunks (PipelinedLM);
  4. expert parallelism: this rank's experts of every MoE layer (ExpertLayout);
  5. recomputation: whole blocks re-run in backward;
  6. full sharding (ZeRO-3): fully_shard per block and per root over the data x context group (HSDP: over each
     replica's ranks, the gradient shards all-reduced over the replicas; a block's local experts, under expert
     parallelism, over their expert-data group within the block's unit);
  -- the run gives each rank storage for its part and fills it (init replay, checkpoint, pretrained boxes);
  7. the optimizer: AdamW over the model's param groups, or ZeRO's sharded AdamW (the experts' state over their
     expert-data group), its state where ``train.optimizer_offload`` keeps it (optim/offload.py);
  8. data-parallel wrapping: DDP around the model or each pipeline chunk (ZeRO's reducer under ZeRO 1 and 2; none
     under ZeRO-3, nor for pipelines under ZeRO-2, whose gradients the finaliser reduce-scatters).
Context parallelism changes no module: every forward runs its attention over the context group (``forward_context``).
"""
from __future__ import annotations

import contextlib

from .. import backend
from .. import distributed as dist
from ..distributed.fsdp import FSDPModule, fully_shard
from ..distributed.optim import ZeroRedundancyOptimizer
from ..nn import MoE
from ..nn import lora as lora_lib
from ..nn.parallel import DistributedDataParallel
from ..nn.parallel.context_parallel import context_parallel
from ..optim import AdamW
from ..optim.offload import make_store
from ..run_state import RunState
from .expert_layout import ExpertLayout
from .finalize_grads import clip_grad_norm, finalize_model_grads
from .moe_lm import moe_chunks
from .pipeline_lm import PipelinedLM, stage_chunks
from .recompute import set_recompute


class LayoutError(ValueError):
    """A layout the model or the world cannot take: names the key, the numbers and a hint."""


def parallelize(spec, model, dims, cfg):
    """Apply steps 1-6 (the module docstring) to ``model`` (a causal LM of ``spec``, whole, built on the meta device
    or eagerly) for this rank of ``dims`` (the run's ParallelDims); ``cfg``: the run config (its parallel, lora and
    train sections). Returns the ParallelPlan; ``plan.model`` is what this rank keeps."""
    plan = ParallelPlan(dims, cfg)
    if dims.tensor_parallel:
        spec.tensor_parallel(model, dims.tp_group, dims.sequence_parallel)
    if cfg.lora.rank:
        lora_lib.apply_lora(model, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.targets())
    if dims.pipeline_parallel:
        model = PipelinedLM(model, dims.pp_group, dims.schedule, dims.virtual)
    if plan.experts is not None:
        plan.experts.split(model, cfg.train.weight_decay)
    set_recompute(model, cfg.train.recompute)
    if plan.zero_stage == 3:  # each rank keeps (and will allocate) only its shards
        if _on_meta(model):
            model.to(dtype=cfg.dtype)
        _shard_fully(model, dims, plan.experts)
    plan.model = model
    return plan


class ParallelPlan:
    """What a layout decided for a run: ``dims``, the ZeRO stage, the expert layout (or None) and, once
    ``parallelize`` has applied it, ``model`` (this rank's part). ``train(train_cfg)`` builds the rest."""

    def __init__(self, dims, cfg):
        self.dims, self.zero_stage, self.dtype = dims, cfg.parallel.zero_stage, cfg.dtype
        self.lora = bool(cfg.lora.rank)  # only the adapters train (and are saved)
        self.model = None
        self.experts = None
        expert = cfg.parallel.expert
        if expert > 1:
            if dims.grad_size % expert:
                raise LayoutError(
                    f"parallel.expert: expected a divisor of the data-parallel size ({dims.grad_size} ranks: expert "
                    f"groups of consecutive data-parallel ranks), got {expert}\nHINT: run on a multiple of {expert} "
                    f"ranks, or set parallel.expert to a divisor of {dims.grad_size}")
            self.experts = ExpertLayout(dims, expert)
        if cfg.train.optimizer_offload == "host" and cfg.device == "auto" and not backend.cuda_available():
            raise LayoutError("train.optimizer_offload: expected 'none' or 'disk' on a run without GPUs (device auto "
                              "found none; host moves the optimizer state from GPU memory to the host's, where a CPU "
                              "run's already is), got 'host'\nHINT: set train.optimizer_offload=disk to keep the state "
                              "in files, or none")

    @property
    def tensor_rank(self):
        """(rank, size) of this rank in the tensor-parallel group its shards were split over ((0, 1) without)."""
        dims = self.dims
        return (dims.tp_rank, dims.tp_size) if dims.tensor_parallel else (0, 1)

    def train(self, train_cfg, offload_dir=None):
        """Steps 7 and 8 (the module docstring) for the model as filled: the TrainingLayout the run's steps use;
        ``offload_dir``: where ``train.optimizer_offload: disk`` keeps each rank's optimizer state (out_dir/offload)."""
        return TrainingLayout(self, train_cfg, offload_dir)


class TrainingLayout:
    """The parts of a layout a training step uses: ``model`` (the module the step runs: DDP-wrapped, or the pipelined
    stage), ``raw_model`` (unwrapped), ``optimizer``, ``finalize_grads()`` and ``clip_grad_norm(max_norm)``
    (finalize_grads.py), ``forward_context`` (context parallelism: () -> the context in which every forward runs its
    attention over the context group; None without), ``no_sync`` (DDP's, deferring the reduction to a step's last
    micro-batch, or None), ``state`` (the RunState its checkpoints are written and read through)."""

    def __init__(self, plan, train_cfg, offload_dir=None):
        self.dims, self.zero_stage, self.experts = plan.dims, plan.zero_stage, plan.experts
        self.raw_model = plan.model
        self.params = list(self.raw_model.parameters())
        self.moe = any(isinstance(m, MoE) for m in self.raw_model.modules())  # some parameters may get no gradient
        self.routes_tokens = bool(moe_chunks(self.raw_model))  # a mixture-of-experts model (or stage of one)
        self.optimizer = self._optimizer(train_cfg, offload_dir)
        self.model = self._wrap_data_parallel()
        self.no_sync = self.model.no_sync if self.model is not self.raw_model else None
        self.forward_context = self._context_parallel if self.dims.context_parallel else None
        self.state = RunState(self.raw_model, self.optimizer, self.dims, self.zero_stage, plan.lora, self.experts)

    def _context_parallel(self):
        """The context every forward runs in: its attention over the context group by the run's method (ring,
        ulysses or hybrid)."""
        d = self.dims
        return context_parallel(d.cp_group, d.cp_method, d.cp_a2a_group, d.cp_ring_group)

    def _optimizer(self, train_cfg, offload_dir=None):
        """AdamW over the model's param groups; with ZeRO sharded across the data-parallel ranks (stage 3: over the
        shards fully_shard keeps; the local experts over their expert-data group). With a mixture of experts some
        parameters may get no gradient in a step, which ZeRO then skips as AdamW skips a .grad of None (agreed over
        the tensor group too: under sequence parallelism its ranks route different tokens)."""
        dims = self.dims
        groups = self.raw_model.optimizer_groups(train_cfg.weight_decay)
        offload = train_cfg.optimizer_offload
        store = make_store(offload, offload_dir or "offload", dist.get_rank()) if offload != "none" else None
        options = dict(lr=train_cfg.learning_rate, betas=(train_cfg.beta1, train_cfg.beta2), eps=train_cfg.eps,
                       offload=store)
        if not self.zero_stage:
            return AdamW(groups, **options)
        if self.experts is not None:
            options.update(expert_params=self.experts.expert_params,
                           expert_data_group=self.experts.groups.expert_data_group)
        return ZeroRedundancyOptimizer(groups, optimizer_class=AdamW, process_group=dims.shard_group,
                                       flat_order=self.raw_model.parameters(),
                                       find_unused_parameters=self.routes_tokens,
                                       unused_also_over=dims.tp_group if dims.sequence_parallel else None, **options)

    def _wrap_data_parallel(self):
        """With data parallelism, DistributedDataParallel (ZeRO's reducer under ZeRO 1 and 2) around the whole model,
        or around each pipeline chunk, averaging gradients while backward runs. Pipeline runs under ZeRO-2 keep whole
        gradients through the schedule (the tied embedding's and sequence-parallel sums need them) and reduce-scatter
        them after it (finalize_grads.py); under ZeRO-3 fully_shard reduce-scatters them itself."""
        dims, model = self.dims, self.raw_model
        if dims.grad_size == 1 or (dims.pipeline_parallel and self.zero_stage == 2) or self.zero_stage == 3:
            return model
        ignored = self.experts.expert_params if self.experts is not None else ()

        def wrap(module):
            return DistributedDataParallel(module, process_group=dims.grad_group,
                                           find_unused_parameters=self.routes_tokens,
                                           zero_optimizer=self.optimizer if self.zero_stage else None,
                                           zero_stage=self.zero_stage or 2, ignored_parameters=ignored)

        if dims.pipeline_parallel:
            model.wrap_chunks(wrap)
            return model
        return wrap(model)

    def parameter_bytes(self):
        """The bytes of parameter values this rank holds (under ZeRO-3 its shards)."""
        return self._held(lambda array: array.nbytes)

    def parameter_count(self):
        """The parameter values (elements) this rank holds: its stage's, its tensor shards, under ZeRO-3 its pieces."""
        return self._held(lambda array: array.size)

    def _held(self, measure):
        spaces = {id(s): s for s in (p.placement.flat_shard for p in self.params) if s is not None}
        whole = sum(measure(p.array) for p in self.params if p.placement.flat_shard is None)
        return int(whole + sum(measure(s.shard) for s in spaces.values()))

    def finalize_grads(self):
        finalize_model_grads(self)

    def clip_grad_norm(self, max_norm):
        return clip_grad_norm(self, max_norm)

    def generates_here(self):
        """Whether this rank takes part in generating samples: rank 0's tensor group (its layers are split), its
        expert group (its experts are), and under ZeRO-3 every data-parallel rank (each forward all-gathers the
        parameters over them)."""
        dims = self.dims
        return (dims.dp_rank == 0 or self.zero_stage == 3
                or (self.experts is not None and dims.dp_rank < self.experts.expert))


def _on_meta(model):
    return next(iter(model.parameters())).device is backend.META


def _shard_fully(model, dims, experts=None):
    """fully_shard ``model`` (a causal LM or a PipelinedLM) block by block over ``dims.shard_mesh`` (the data x context
    group, or HSDP's shard and replicate groups), then each root (the model, or each pipeline chunk) for what is left
    (embeddings, final norm, output layer), as torchtitan applies FSDP2. A pipeline's tied embedding and its
    last-stage copy are units of their own (the embedding module on the first stage, the output layer on the last):
    their shards cover the same elements on both stages, so summing their gradient shards over the embedding group
    sums the copies'.

    Expert parallelism (``experts``, the ExpertLayout): a block's local experts are replicated only over their
    expert-data group, so they are sharded over it (torchtitan shards them over its ``edp`` mesh), in the block's
    unit: every rank of an expert group runs every block, so gathering and reducing them with the block issues the
    same collectives on every rank whichever experts its tokens reached. Their gradient shards are the sum over the
    expert-data group divided by the data-parallel size (each replica's gradient already sums its expert group's
    tokens): the one-process gradient, as ``ExpertLayout.reduce_grads`` gives under ZeRO 1 and 2."""
    roots = list(model.chunks) if dims.pipeline_parallel else [model]
    shared = {id(p) for p in model.shared_embedding_params()} if dims.pipeline_parallel else set()
    mesh = dims.shard_mesh  # the grad group, or with HSDP its replicas' shard and replicate groups
    by_experts = None
    if experts is not None:
        local = {id(p) for p in experts.expert_params}

        def by_experts(p):
            return experts.groups.expert_data_group if id(p) in local else None
    for root in roots:
        for module in root.modules():
            if any(id(p) in shared for p in module._parameters.values() if p is not None):
                fully_shard(module, mesh)
        for _, block in root.numbered_blocks():
            fully_shard(block, mesh, shard_group_fn=by_experts)
        fully_shard(root, mesh, shard_group_fn=by_experts)
    return model


@contextlib.contextmanager
def gathered(model, writeback=False, trainable_only=False):
    """Under ZeRO-3, ``model``'s parameters gathered whole on every rank while the block runs (collective): for
    writing and reading checkpoints of the whole format and exporting adapters; otherwise nothing."""
    roots = [m for m in stage_chunks(model) if isinstance(m, FSDPModule)]
    with contextlib.ExitStack() as stack:
        for root in roots:
            stack.enter_context(root.unsharded(writeback, trainable_only))
        yield model


__all__ = ["parallelize", "ParallelPlan", "TrainingLayout", "LayoutError", "gathered"]
