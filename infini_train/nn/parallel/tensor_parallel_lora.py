"""LoRA adapters on the tensor-parallel linears, split the way Megatron / NeMo split them:

    ColumnParallelLinear   A whole (r, in);       B split like the weight rows (out/tp, r), same ShardSpec
    RowParallelLinear      A split (r, in/tp);    B whole (out, r)

The adapter's hidden activation (..., r) crosses the group, never the layer's input: the column layer's A runs on
the input the rank holds and its output is copied in (all-reduced gradient) or, under sequence parallelism,
all-gathered along the sequence; the row layer's partial A output is all-reduced (or reduce-scattered along the
sequence) before B. Every adapter gradient is then exact on every rank, except the two that see one sequence
slice under sequence parallelism (the column A, the row B): those are marked ``sequence_parallel`` and summed by
``all_reduce_sequence_parallel_grads`` as the layer norms are.

Importing this module registers the wrappers with nn.lora (register_lora_wrapper), so apply_lora wraps these
layers without nn importing nn.parallel.
"""
from __future__ import annotations

from ... import backend
from .. import functional as F
from ...placement import place
from ..layers import Dropout
from ..lora import LoRALinear, register_lora_wrapper
from .mappings import (copy_to_tensor_parallel_region, gather_from_sequence_parallel_region,
                       gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
                       reduce_scatter_to_sequence_parallel_region, scatter_to_tensor_parallel_region)
from .sharded_init import derived_from
from .tensor_parallel import (SEQUENCE_DIM, TP_RANDOM, ColumnParallelLinear, ParallelParameter, RowParallelLinear,
                              ShardSpec, shard_parameter)
from .whole_state import shard_state_dict, whole_state_dict


class _ParallelLoRALinear(LoRALinear):
    @property
    def group(self):
        return self.base_layer.group

    def whole_weight(self, part):
        if self.group is None:
            return super().whole_weight(part)
        return whole_state_dict(getattr(self, part), self.group)["weight"]

    def load_whole_weight(self, part, weight):
        if self.group is None:
            return super().load_whole_weight(part, weight)
        sub = getattr(self, part)
        sub.load_state_dict(shard_state_dict(sub, {"weight": weight}, self.group))

    def _sharded_dropout(self, x):
        """Dropout of an activation split over the group: each rank draws its own mask (the per-rank stream)."""
        if not self.training or not isinstance(self.lora_dropout, Dropout) or self.group.size == 1:
            return self.lora_dropout(x)
        with backend.fork_rng(TP_RANDOM):
            return self.lora_dropout(x)


def _rewrapped(param, cls):
    """``param``'s storage as a ``cls`` parameter; built on the meta device, it takes ``param``'s recorded init."""
    out = cls(param, requires_grad=param.requires_grad)
    if param.device is backend.META:
        derived_from(out, param)
    return out


class ColumnParallelLoRALinear(_ParallelLoRALinear):
    """LoRA on a ColumnParallelLinear: A whole, B split like the weight's rows (fused blocks included)."""

    def _split_adapters(self):
        base = self.base_layer
        a = self.lora_A.weight
        self.lora_A.weight = place(_rewrapped(a, ParallelParameter), sequence_parallel=bool(base.sequence_parallel))
        self.lora_B.weight = shard_parameter(self.lora_B.weight, ShardSpec(0, base.blocks), base.group)

    def forward(self, x):
        base = self.base_layer
        y = base(x)
        if self.merged:
            return y
        if base.sequence_parallel:  # x is this rank's slice of the sequence: gather A's (B, T/tp, r) output
            h = F.linear(self._sharded_dropout(x), self.lora_A.weight)
            h = gather_from_sequence_parallel_region(h, base.group, SEQUENCE_DIM)
        else:
            h = copy_to_tensor_parallel_region(F.linear(self.lora_dropout(x), self.lora_A.weight), base.group)
        delta = F.linear(h, self.lora_B.weight) * self.scaling
        if base.gather_output:
            delta = _gather_columns(base, delta)
        return y + delta


class RowParallelLoRALinear(_ParallelLoRALinear):
    """LoRA on a RowParallelLinear: A split like the weight's columns, B whole."""

    def _split_adapters(self):
        base = self.base_layer
        self.lora_A.weight = shard_parameter(self.lora_A.weight, ShardSpec(1), base.group)
        b = self.lora_B.weight
        self.lora_B.weight = place(_rewrapped(b, ParallelParameter), sequence_parallel=bool(base.sequence_parallel))

    def forward(self, x):
        base = self.base_layer
        y = base(x)
        if self.merged:
            return y
        if base.input_is_parallel:
            x = self._sharded_dropout(x)
        else:
            x = scatter_to_tensor_parallel_region(self.lora_dropout(x), base.group)
        h = F.linear(x, self.lora_A.weight)  # partial: this rank's input features only
        if base.sequence_parallel:
            h = reduce_scatter_to_sequence_parallel_region(h, base.group, SEQUENCE_DIM)
        else:
            h = reduce_from_tensor_parallel_region(h, base.group)
        return y + F.linear(h, self.lora_B.weight) * self.scaling


def _gather_columns(layer, y):
    """A ColumnParallelLinear's gather_output: every rank's features, fused blocks back in the full order."""
    y = gather_from_tensor_parallel_region(y, layer.group)
    size = layer.group.size
    if layer.blocks > 1 and size > 1:
        lead = tuple(y.shape[:-1])
        part = layer.out_features // (size * layer.blocks)
        y = y.reshape(*lead, size, layer.blocks, part).transpose(-3, -2).reshape(*lead, layer.out_features)
    return y


register_lora_wrapper(ColumnParallelLinear, ColumnParallelLoRALinear, "a ColumnParallelLinear")
register_lora_wrapper(RowParallelLinear, RowParallelLoRALinear, "a RowParallelLinear")

__all__ = ["ColumnParallelLoRALinear", "RowParallelLoRALinear"]
