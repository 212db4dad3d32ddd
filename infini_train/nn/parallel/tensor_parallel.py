"""Tensor parallelism (Megatron-LM style): linear layers whose weights are split across a process group.

    ColumnParallelLinear   weight rows (output features) split: each rank computes its slice of the output
    RowParallelLinear      weight columns (input features) split: each rank's partial output is summed over the group

An MLP or attention projection is column -> (elementwise) -> row: one all-reduce forward, one backward. With
sequence parallelism the activations between such pairs are split along the sequence (dim 1 of (B, T, C)): the
column layer all-gathers the sequence first and the row layer reduce-scatters it instead of all-reducing.

How a parameter is split is its placement's ``tensor_shard`` (a ShardSpec; None: replicated), so checkpoints can be
written whole (``whole_from_shards``) and loaded into any layout (``shard_from_whole``). Parameters whose gradient is
partial per sequence shard (layer norms, row-parallel biases under sequence parallelism) are placed
``sequence_parallel``; ``all_reduce_sequence_parallel_grads`` sums those gradients over the group.

Layers built directly initialise the whole weight as nn.Linear would (same RNG stream on every rank) and keep
their shard, so a seeded run builds the shards of the single-device layer's weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import backend
from ...autograd.grad_mode import no_grad
from ...distributed import default_group
from ...distributed.grad_hooks import globally_unused
from ...placement import place
from ...tensor import Tensor, array_of
from .. import functional as F
from .sharded_init import derived_from
from ..layers import Linear
from ..module import Module, Parameter
from .mappings import (
    all_gather_array,
    copy_to_tensor_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
)

SEQUENCE_DIM = 1  # activations are (B, T, C)


# the named RNG stream (backend.fork_rng) of dropout on activations split across a tensor group: seeded per rank
TP_RANDOM = "tensor-parallel shards"


# ------------------------------------------------------------------------------------------ partition specs
@dataclass(frozen=True)
class ShardSpec:
    """How a parameter is split over a group of ``size`` ranks along ``dim``.

    The whole tensor's ``dim`` is ``blocks`` equal consecutive blocks; each block is split into ``size`` equal
    contiguous parts and rank r keeps part r of every block, in block order (blocks=3: the fused q|k|v rows of
    GPT-2's c_attn, each rank keeping its heads' rows of q, k and v). ``whole_size``: the real length of ``dim``
    when the whole tensor is padded with zeros at its end up to a multiple of size * blocks * pad_to_multiple_of
    (a vocabulary); unsharding drops the padding again.
    """

    dim: int
    blocks: int = 1
    whole_size: int | None = None
    pad_to_multiple_of: int = 1

    def padded_length(self, length, size):
        """The length of ``dim`` once padded for a group of ``size`` (``length`` when no padding is declared)."""
        if self.whole_size is None:
            return length
        multiple = size * self.blocks * self.pad_to_multiple_of
        return -(-self.whole_size // multiple) * multiple


def _spec_error(what, expected, received, hint):
    return ValueError(f"{what}: expected {expected}, got {received}\nHINT: {hint}")


def shard_from_whole(whole_array, spec, rank, size, xp):
    """Rank ``rank``'s shard (a new array) of ``whole_array`` split as ``spec`` says over ``size`` ranks. The whole
    array's ``dim`` has length ``spec.whole_size`` (padded here with zeros), or is already padded."""
    dim = spec.dim % whole_array.ndim
    length = whole_array.shape[dim]
    padded = spec.padded_length(length, size)
    multiple = size * spec.blocks
    if spec.whole_size is not None and length not in (spec.whole_size, padded):
        raise _spec_error("shard_from_whole", f"dim {dim} of length whole_size={spec.whole_size} (or {padded} padded)",
                          f"an array of shape {tuple(whole_array.shape)}",
                          "pass the whole tensor, as whole_from_shards returns it")
    if padded % multiple:
        raise _spec_error("shard_from_whole", f"dim {dim} of length divisible by group size x blocks = {size} x "
                          f"{spec.blocks} = {multiple}", f"an array of shape {tuple(whole_array.shape)} (length "
                          f"{length})", "choose a layer size divisible by the tensor-parallel size (per block), or "
                          "declare whole_size in the ShardSpec to pad it")
    front = xp.moveaxis(whole_array, dim, 0)
    if padded > length:
        front = xp.concatenate([front, xp.zeros((padded - length,) + front.shape[1:], dtype=front.dtype)])
    part = padded // multiple
    mine = front.reshape((spec.blocks, size, part) + front.shape[1:])[:, rank]
    mine = mine.reshape((spec.blocks * part,) + front.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(mine, 0, dim))


def whole_from_shards(shard_array, spec, group):
    """The whole array (padding dropped) on every rank of ``group``: the shards all-gathered and put back in
    ``spec``'s order. ``shard_array`` may be a Tensor or a raw array."""
    shard_array = array_of(shard_array)
    xp = backend.device_of_array(shard_array).array_module()
    dim = spec.dim % shard_array.ndim
    local = shard_array.shape[dim]
    if local % spec.blocks:
        raise _spec_error("whole_from_shards", f"a shard whose dim {dim} holds blocks={spec.blocks} equal parts",
                          f"a shard of shape {tuple(shard_array.shape)}", "pass the shard this spec describes")
    gathered = all_gather_array(xp, shard_array, group, dim) if group.size > 1 else shard_array
    front = xp.moveaxis(gathered, dim, 0)
    rest = front.shape[1:]
    front = front.reshape((group.size, spec.blocks, local // spec.blocks) + rest).swapaxes(0, 1)
    front = front.reshape((group.size * local,) + rest)
    if spec.whole_size is not None:
        front = front[:spec.whole_size]
    return xp.ascontiguousarray(xp.moveaxis(front, 0, dim))


class ParallelParameter(Parameter):
    """A Parameter made by a tensor-parallel split (its placement says how: a ShardSpec, or replicated, and whether its
    gradient is partial per sequence shard)."""


def shard_parameter(param, spec, group):
    """A ParallelParameter holding this rank's shard of the whole Parameter ``param``."""
    xp = param.device.array_module()
    if param.device is backend.META:  # shapes only: the shard's, padding included
        shape = list(param.shape)
        dim = spec.dim % len(shape)
        shape[dim] = spec.padded_length(shape[dim], group.size) // group.size
        array = xp.empty(tuple(shape), param.array.dtype)
    else:
        with param.device.context():
            array = shard_from_whole(param.array, spec, group.rank, group.size, xp)
    out = place(ParallelParameter(Tensor._make(array, param.device), requires_grad=param.requires_grad),
                tensor_shard=spec)
    _keep_init_source(param, out)
    return out


def _keep_init_source(source, param):
    """A split or copied parameter of a model built on the meta device takes its source's values."""
    if source.device is backend.META:
        derived_from(param, source)


def _replicated_parameter(param):
    out = ParallelParameter(Tensor._make(backend.copy_array(param.array, param.device), param.device),
                            requires_grad=param.requires_grad)
    _keep_init_source(param, out)
    return out


def mark_sequence_parallel(module):
    """Place every parameter of ``module`` (e.g. a LayerNorm running on sequence shards) ``sequence_parallel``.
    Plain Parameters are replaced by ParallelParameters over the same memory, keeping the rest of their placement (a
    mixture of experts' experts stay ``routed``), so call this before building the optimizer."""
    replaced = {}  # id of a plain Parameter -> its replacement, so tied parameters stay tied
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False, remove_duplicate=False)):
            if not isinstance(p, ParallelParameter):
                if id(p) not in replaced:
                    replaced[id(p)] = ParallelParameter(p, requires_grad=p.requires_grad)
                    replaced[id(p)].placement = p.placement
                    _keep_init_source(p, replaced[id(p)])
                p = replaced[id(p)]
                setattr(sub, name, p)
            place(p, sequence_parallel=True)
    return module


@no_grad()
def all_reduce_sequence_parallel_grads(module, group):
    """Sum over ``group`` the gradients of the parameters placed ``sequence_parallel`` (one all-reduce per dtype)."""
    all_reduce_grads([p.grad for p in module.parameters()
                      if p.placement.sequence_parallel and p.grad is not None], group)


@no_grad()
def all_reduce_grads(grads, group):
    """Sum the gradient Tensors ``grads`` over ``group`` in place, coalesced: one all-reduce per (dtype, device)."""
    if group is None or group.size == 1 or not grads:
        return
    by_kind = {}
    for g in grads:
        by_kind.setdefault((g.dtype, g.device), []).append(g)
    for (_, device), same in by_kind.items():
        xp = device.array_module()
        with device.context():
            flat = xp.concatenate([g.array.reshape(-1) for g in same])
            group.all_reduce(flat)
            offset = 0
            for g in same:
                g.array[...] = flat[offset:offset + g.array.size].reshape(g.array.shape)
                g._version[0] += 1
                offset += g.array.size


def all_reduce_grads_where_any(params, group):
    """Sum the gradients of ``params`` over ``group`` where some rank has one (a parameter may get none on a rank:
    an expert none of its tokens reached): a rank without it contributes zeros, and a parameter no rank used keeps
    None (as in one process). One small all-reduce of flags first (``globally_unused``, as DDP and ZeRO agree), then
    ``all_reduce_grads``."""
    if group is None or group.size == 1:
        return
    unused = set(globally_unused([p.grad is not None for p in params], group))
    with no_grad():
        for k, p in enumerate(params):
            if p.grad is None and k not in unused:
                p.grad = Tensor._make(p.device.array_module().zeros_like(p.array), p.device)
    all_reduce_grads([p.grad for p in params if p.grad is not None], group)


def _check_divisible(layer, name, value, size, blocks=1):
    if value % (size * blocks):
        per = f" x blocks {blocks} = {size * blocks}" if blocks > 1 else ""
        raise ValueError(f"{layer}: expected {name} divisible by the tensor-parallel group size {size}{per}, "
                         f"got {name}={value} (remainder {value % (size * blocks)})\n"
                         f"HINT: choose {name} a multiple of {size * blocks} (for attention: n_head divisible by "
                         "the tensor-parallel size), or use a smaller tensor-parallel group")


# ------------------------------------------------------------------------------------------------ layers
class ColumnParallelLinear(Module):
    """y = x @ W.T + b with W's rows (output features) split over ``group``: weight (out/size, in), bias (out/size,).

    Input replicated on every rank (or, with ``sequence_parallel``, split along dim 1 and all-gathered first);
    output this rank's features, or all of them in the whole layer's order with ``gather_output``. ``blocks``:
    the output is that many fused matrices (q|k|v: 3) and each rank keeps its part of every one.
    """

    def __init__(self, in_features, out_features, bias=True, gather_output=False, sequence_parallel=False,
                 group=None, blocks=1, device=None, dtype=None, _whole=None):
        super().__init__()
        self.group = group if group is not None else default_group()
        _check_divisible("ColumnParallelLinear", "out_features", out_features, self.group.size, blocks)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.gather_output, self.sequence_parallel, self.blocks = gather_output, sequence_parallel, int(blocks)
        self.output_size_per_partition = self.out_features // self.group.size
        whole = _whole if _whole is not None else Linear(in_features, out_features, bias, device=device, dtype=dtype)
        spec = ShardSpec(0, self.blocks)
        self.weight = shard_parameter(whole.weight, spec, self.group)
        if whole.bias is not None:
            self.bias = shard_parameter(whole.bias, spec, self.group)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear, group, blocks=1, gather_output=False, sequence_parallel=False):
        """This rank's shard of the whole ``linear`` (its weights are copied, not shared)."""
        out_features, in_features = linear.weight.shape
        return cls(in_features, out_features, linear.bias is not None, gather_output, sequence_parallel, group,
                   blocks, _whole=linear)

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_from_sequence_parallel_region(x, self.group, SEQUENCE_DIM)
        else:
            x = copy_to_tensor_parallel_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        if not self.gather_output:
            return y
        y = gather_from_tensor_parallel_region(y, self.group)
        size = self.group.size
        if self.blocks > 1 and size > 1:  # rank-major (rank, block, part) back to the whole layout (block, rank, part)
            lead = tuple(y.shape[:-1])
            part = self.out_features // (size * self.blocks)
            y = y.reshape(*lead, size, self.blocks, part).transpose(-3, -2).reshape(*lead, self.out_features)
        return y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.output_size_per_partition} "
                f"on this rank), bias={self.bias is not None}, blocks={self.blocks}, gather_output="
                f"{self.gather_output}, sequence_parallel={self.sequence_parallel}, tp_size={self.group.size}")


class RowParallelLinear(Module):
    """y = x @ W.T + b with W's columns (input features) split over ``group``: weight (out, in/size); bias (out,)
    replicated and added once after the partial outputs are summed over the group.

    Input this rank's features (``input_is_parallel``; otherwise the whole input, of which this rank keeps its
    chunk of the last dim). Output replicated, or with ``sequence_parallel`` reduce-scattered along dim 1; then the
    bias gradient is partial per sequence shard and the bias is marked ``sequence_parallel``.
    """

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, sequence_parallel=False,
                 group=None, device=None, dtype=None, _whole=None):
        super().__init__()
        self.group = group if group is not None else default_group()
        _check_divisible("RowParallelLinear", "in_features", in_features, self.group.size)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.input_is_parallel, self.sequence_parallel = input_is_parallel, sequence_parallel
        self.input_size_per_partition = self.in_features // self.group.size
        whole = _whole if _whole is not None else Linear(in_features, out_features, bias, device=device, dtype=dtype)
        self.weight = shard_parameter(whole.weight, ShardSpec(1), self.group)
        if whole.bias is not None:
            self.bias = place(_replicated_parameter(whole.bias), sequence_parallel=bool(sequence_parallel))
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_linear(cls, linear, group, input_is_parallel=True, sequence_parallel=False):
        """This rank's shard of the whole ``linear`` (its weights are copied, not shared)."""
        out_features, in_features = linear.weight.shape
        return cls(in_features, out_features, linear.bias is not None, input_is_parallel, sequence_parallel, group,
                   _whole=linear)

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_tensor_parallel_region(x, self.group)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.group, SEQUENCE_DIM)
        else:
            y = reduce_from_tensor_parallel_region(y, self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.input_size_per_partition} on this rank), out_features="
                f"{self.out_features}, bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}, tp_size={self.group.size}")


__all__ = ["ShardSpec", "shard_from_whole", "whole_from_shards", "ParallelParameter", "shard_parameter",
           "mark_sequence_parallel", "all_reduce_sequence_parallel_grads", "all_reduce_grads", "ColumnParallelLinear",
           "RowParallelLinear"]
