"""A language model split into pipeline stages: the embeddings on the first, the final norm, the output layer and
the loss on the last, n_layer / (P x V) blocks per model chunk. The model class says how to cut itself
(``pipeline_chunk``: a module holding some blocks, and the embeddings / head when first / last) and which weights it
ties (``tied_weight_names``); GPT2 and Llama do.

``PipelinedLM(model, group, schedule, virtual)`` takes a whole model (built and initialised as in one process, and
possibly split over a tensor group already) and keeps this stage's chunks. Parameters keep the whole model's names,
so checkpoints are the files of a one-process run. A tied embedding / output weight lives twice, as the first
stage's embedding and the last stage's output layer (a copy placed as a ``tied_copy``); their gradients are summed
over the embedding group (first and last stage) before the step, so the copies stay equal (Megatron-LM's embedding
group), and only the embedding counts in the gradient norm. In a V (zbv, dualpipev) the first stage runs the last
chunk too and sums the two itself.

Training runs the schedule (``train_step``); calling the model runs one batch through the stages in turn and gives
every rank of the pipeline the result, so validation and generation work unchanged.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .. import backend
from .. import nn
from ..autograd.grad_mode import no_grad
from ..nn.parallel.pipeline import PipelineParallel
from ..nn.parallel.pipeline_schedules import stage_chunks as stage_chunks_of
from ..nn.parallel.sharded_init import derived_from
from ..nn.parallel.tensor_parallel import ParallelParameter
from ..placement import place
from ..tensor import Tensor
from .flops import training_flops_per_token
from .lm_config import pipeline_problems
from .tensor_parallel_lm import VocabParallelHead


def _head_copy(model):
    """The last stage's output layer: the tied weight copied into its own Parameter (placed as a tied copy)."""
    source = model.get_parameter(model.tied_weight_names()[0])
    weight = ParallelParameter(Tensor._make(backend.copy_array(source.array, source.device), source.device),
                               requires_grad=source.requires_grad)
    place(weight, tensor_shard=source.placement.tensor_shard, tied_copy=True)
    if source.device is backend.META:  # sharded initialisation gives the copy the tied weight's values
        derived_from(weight, source)
    if model.tp is not None:
        return VocabParallelHead(weight, model.tp.group, model.tp.sequence_parallel)
    head = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(head)
    head.in_features, head.out_features = model.config.hidden_size, model.config.vocab_size
    head.weight = weight
    head.register_parameter("bias", None)
    return head


class PipelinedLM(nn.Module):
    """This pipeline stage's part of a language model (GPT2 or Llama): ``chunks`` (V of them), run by a
    PipelineParallel over ``group``."""

    def __init__(self, model, group, schedule="1f1b", virtual=1):
        super().__init__()
        P, V, L = group.size, int(virtual), model.config.num_layers
        problems = pipeline_problems(model.config, P, V)
        if problems:
            raise ValueError(f"{problems[0]}\nHINT: choose sizes whose product divides the layers")
        self.config, self.tp, self.group = model.config, model.tp, group
        self.tied = model.tied_weight_names()  # (embedding, output layer) names of a tied weight, or None
        # the weights summed over the embedding group: the tied ones, or an embedding and the last stage's copy
        # (DeepSeek-V3's multi-token prediction: deepseek_v3/mtp.py)
        self.shared = self.tied or model.shared_embedding_names()
        per_chunk = L // (P * V)
        chunks = []
        for c in stage_chunks_of(schedule, P, V, group.rank):
            first, last = c == 0, c == P * V - 1
            head = _head_copy(model) if last and not first and self.tied is not None else None
            chunks.append(model.pipeline_chunk(range(c * per_chunk, (c + 1) * per_chunk), first, last, head))
        self.chunks = nn.ModuleList(chunks)
        self.pipe = PipelineParallel(chunks, group, schedule, V)
        # in a V (zbv, dualpipev) the first stage runs the last chunk too: its copy of a tied weight is summed there
        self.shared_on_one_stage = self.pipe.owner(0) == self.pipe.owner(P * V - 1)
        # the whole model's layout, kept to write and read one-process checkpoints
        self.whole_state_names = list(model.state_dict(keep_vars=True))
        names = {id(p): n for n, p in model.named_parameters()}
        self.whole_groups = [[names[id(p)] for p in g["params"]] for g in model.optimizer_groups(0.0)]
        self.whole_num_params = {(non_embedding, trainable): model.num_params(non_embedding, trainable)
                                 for non_embedding in (False, True) for trainable in (None, False, True)}

    # ---------------------------------------------------------------------------------------- the model API
    def num_params(self, non_embedding=False, trainable=None):
        """Parameters of the whole model (every stage)."""
        return self.whole_num_params[bool(non_embedding), trainable]

    def flops_per_token(self, seq_len=None):
        cfg = self.config
        return training_flops_per_token(self, cfg.num_layers, cfg.num_heads, cfg.head_dim,
                                        seq_len or cfg.context_length, self.chunks[0].idle_params)

    def optimizer_groups(self, weight_decay):
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """This stage's entries under the whole model's names."""
        out = {} if destination is None else destination
        for chunk in self.chunks:
            chunk.state_dict(out, prefix, keep_vars)
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Load this stage's entries from a whole model's state dict."""
        own = self.state_dict(keep_vars=True)
        for chunk in self.chunks:
            chunk.load_state_dict({k: state_dict[k] for k in chunk.state_dict(keep_vars=True) if k in state_dict},
                                  strict=strict)
        return [k for k in own if k not in state_dict], []

    def new_kv_cache(self, batch_size, device, dtype=backend.float32):
        return self.chunks[0].new_kv_cache(batch_size, device, dtype)

    def _activation(self, batch, length, dtype):
        """What one chunk passes the next: [(shape, dtype)] of the hidden states and of what the model adds."""
        tp = self.tp
        local = length // tp.size if tp is not None and tp.sequence_parallel else length
        return [((batch, local, self.config.hidden_size), dtype)] + self.chunks[0].pipeline_extras(dtype)

    def _dtype(self):
        return next(iter(self.parameters())).dtype

    # ------------------------------------------------------------------------------------------- running
    def wrap_chunks(self, wrap):
        """Run the schedule through ``wrap(chunk)`` (a DistributedDataParallel) for each of this stage's chunks: a
        chunk's gradients are averaged over the data-parallel group during its last backward of a step. The
        model's own modules, parameter names and state stay the chunks'."""
        self.pipe.set_data_parallel([wrap(chunk) for chunk in self.chunks])

    def train_step(self, inputs, targets, backward=None, forward_context=None, batch_contexts=None):
        """Forward and backward of the micro-batches (see PipelineParallel.train_step); returns their mean loss on
        every stage."""
        parts = self._activation(*inputs[0].shape, self._dtype())
        losses = self.pipe.train_step(inputs, targets, parts, inputs[0].device, backward, forward_context,
                                      self._with_tokens(inputs, batch_contexts))
        mean = np.array([np.mean(losses) if losses is not None else 0.0], np.float64)
        self.group.broadcast(mean, self.pipe.owner(self.pipe.num_chunks - 1))
        return float(mean[0])

    def _with_tokens(self, inputs, batch_contexts):
        """The micro-batches' contexts, giving the last stage their input tokens where its chunk reads them
        (DeepSeek-V3's multi-token prediction modules)."""
        last = self.chunks[-1]
        if not last.reads_input_tokens:
            return batch_contexts
        contexts = batch_contexts or [contextlib.nullcontext] * len(inputs)

        def context(m):
            @contextlib.contextmanager
            def both():
                with contexts[m](), last.input_tokens(inputs[m]):
                    yield
            return both
        return [context(m) for m in range(len(inputs))]

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """One batch through every stage in turn: (logits, loss) on every rank of the pipeline (logits only when
        ``last_only`` (generation), the loss when ``targets`` are given)."""
        B, T = idx.shape
        parts = self._activation(B, T, self._dtype())
        tokens = (self._with_tokens([idx], None) or [contextlib.nullcontext])[0]
        with no_grad(), tokens():
            out = self.pipe.forward(idx, parts, idx.device, targets=targets, kv_cache=kv_cache,
                                    last_only=last_only)
        if kv_cache is not None:
            kv_cache.advance(T)
        last = self.pipe.owner(self.pipe.num_chunks - 1)
        loss = logits = None
        if targets is not None:
            value = np.array([out[1].item() if out is not None else 0.0], np.float64)
            self.group.broadcast(value, last)
            loss = Tensor(np.array(value[0], np.float32))
        if last_only:
            xp = idx.device.array_module()
            with idx.device.context():
                buffer = (xp.ascontiguousarray(out[0].array, dtype=backend.float32) if out is not None
                          else xp.empty((B, 1, self.config.vocab_size), backend.float32))
            logits = Tensor._make(buffer, idx.device)
            self.group.broadcast(logits, last)
        return logits, loss

    def generate(self, idx, max_new_tokens, **kwargs):
        """Sampling through the pipeline: every rank of it gets the same tokens (see GPT2.generate)."""
        from .generation import generate

        return generate(self, idx, max_new_tokens, **kwargs)

    def moe_layers(self):
        """The MoE layers of this stage's chunks, in layer order (a mixture-of-experts model's)."""
        return [m for chunk in self.chunks for m in chunk.moe_layers()]

    # ------------------------------------------------------------------------------------------- weights
    def shared_embedding_params(self):
        """The tied weight on this stage: the embedding on the first stage, its copy on the last, else []."""
        if self.shared is None:
            return []
        own = self.state_dict(keep_vars=True)
        return list({id(own[n]): own[n] for n in self.shared if n in own}.values())

    def canonical_names(self):
        """{id(parameter): its name in the whole model's optimizer state} (a tied output layer's copy is the
        embedding)."""
        names = {}
        for name, p in self.state_dict(keep_vars=True).items():
            if isinstance(p, nn.Parameter):
                names.setdefault(id(p), self.shared[0] if p.placement.tied_copy else name)
        return names



def stage_chunks(model):
    """The model chunks ``model`` runs: a PipelinedLM's (this stage's), else the model itself."""
    return list(model.chunks) if isinstance(model, PipelinedLM) else [model]

__all__ = ["PipelinedLM", "stage_chunks"]
