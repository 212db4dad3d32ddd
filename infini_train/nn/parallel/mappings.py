"""Communication across a tensor-parallel group, each pattern a small autograd Op whose backward is the
conjugate collective (as Megatron-LM's ``tensor_parallel/mappings.py``):

    copy_to_tensor_parallel_region              forward: identity            backward: all-reduce (SUM)
    reduce_from_tensor_parallel_region          forward: all-reduce (SUM)    backward: identity
    scatter_to_tensor_parallel_region           forward: keep my chunk of -1 backward: all-gather along -1
    gather_from_tensor_parallel_region          forward: all-gather along -1 backward: keep my chunk of -1
    scatter_to_sequence_parallel_region         forward: keep my chunk of dim backward: all-gather along dim
    gather_from_sequence_parallel_region        forward: all-gather along dim backward: reduce-scatter along dim
    reduce_scatter_to_sequence_parallel_region  forward: reduce-scatter dim  backward: all-gather along dim

Chunks are contiguous and in group-rank order: rank r holds elements [r * n, (r + 1) * n) of the dim. Gathers and
reduce-scatters along another dim than the first move that dim to the front, run the flat collectives
(``all_gather_into_tensor`` / ``reduce_scatter_tensor``, one contiguous buffer) and move it back. In a group of one
every mapping is the identity (its output a view of its input) and no collective runs.

Collectives never write into an array they were handed: forward inputs and incoming gradients may be shared with
other parts of the graph, so each reduction works on a fresh copy.
"""
from __future__ import annotations

from ...autograd.function import Op, op_error
from ...distributed import ReduceOp, default_group


# ---------------------------------------------------------------------------------------- array collectives
def all_reduce_array(xp, array, group, op=ReduceOp.SUM):
    """A new array: ``array`` reduced over ``group`` (the input is left untouched)."""
    out = xp.array(array, order="C", copy=True)
    group.all_reduce(out, op)
    return out


def all_gather_array(xp, array, group, dim):
    """Every rank's ``array`` concatenated along ``dim`` in rank order (a new contiguous array)."""
    front = xp.ascontiguousarray(xp.moveaxis(array, dim, 0))
    out = xp.empty((group.size * front.shape[0],) + front.shape[1:], dtype=array.dtype)
    group.all_gather_into_tensor(out, front)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, dim))


def reduce_scatter_array(xp, array, group, dim, what):
    """This rank's chunk along ``dim`` of the sum over ``group`` of every rank's ``array`` (a new array)."""
    chunk = chunk_length(array.shape, dim, group.size, what)
    front = xp.ascontiguousarray(xp.moveaxis(array, dim, 0))
    out = xp.empty((chunk,) + front.shape[1:], dtype=array.dtype)
    group.reduce_scatter_tensor(out, front, ReduceOp.SUM)
    return xp.ascontiguousarray(xp.moveaxis(out, 0, dim))


def split_array(array, rank, size, dim, what):
    """This rank's contiguous chunk of ``array`` along ``dim`` (a copy: the output never aliases the input)."""
    chunk = chunk_length(array.shape, dim, size, what)
    index = [slice(None)] * array.ndim
    index[dim] = slice(rank * chunk, (rank + 1) * chunk)
    return array[tuple(index)].copy()


def chunk_length(shape, dim, size, what):
    length = shape[dim]
    if length % size:
        raise op_error(what, f"dim {dim} of length divisible by the tensor-parallel group size {size}",
                       f"a tensor of shape {tuple(shape)} (length {length}, remainder {length % size})",
                       f"make that length a multiple of {size} (e.g. the sequence length for sequence "
                       "parallelism, or the hidden size for tensor parallelism), or use a smaller group")
    return length // size


def resolve_dim(dim, ndim, what):
    if not -ndim <= dim < ndim:
        raise op_error(what, f"dim in [{-ndim}, {ndim}) for a {ndim}-d tensor", f"dim={dim}",
                       "activations are (B, T, C): the sequence is dim 1, the hidden size dim -1")
    return dim % ndim


# --------------------------------------------------------------------------------------------------- ops
class _Mapping(Op):
    """A mapping over ``group`` along ``dim``. In a group of one it is the identity and its output a view."""

    what = ""
    uses_dim = True

    def __init__(self, group, dim=-1):
        self.group = group if group is not None else default_group()
        self.dim = dim
        if self.group.size == 1:
            self.is_view = True

    def forward(self, x):
        if self.uses_dim:
            if x.ndim == 0:
                raise op_error(self.what, "a tensor with at least one dim", "a 0-d tensor")
            self.dim = resolve_dim(self.dim, x.ndim, self.what)
        if self.group.size == 1:
            return x.view()
        return self.parallel_forward(x)

    def backward(self, g):
        return g if self.group.size == 1 else self.parallel_backward(g)

    def view_of(self, array):
        return array.view()

    # the pieces every mapping is made of, on this op's group and dim
    def reduce(self, a):
        return all_reduce_array(self.xp, a, self.group)

    def gather(self, a):
        return all_gather_array(self.xp, a, self.group, self.dim)

    def split(self, a):
        return split_array(a, self.group.rank, self.group.size, self.dim, self.what)

    def reduce_scatter(self, a):
        return reduce_scatter_array(self.xp, a, self.group, self.dim, self.what)


class CopyToTensorParallelRegion(_Mapping):
    what = "copy_to_tensor_parallel_region"
    uses_dim = False
    is_view = True

    def forward(self, x):
        return x.view()

    def parallel_backward(self, g):
        return self.reduce(g)


class ReduceFromTensorParallelRegion(_Mapping):
    what = "reduce_from_tensor_parallel_region"
    uses_dim = False

    def parallel_forward(self, x):
        return self.reduce(x)

    def parallel_backward(self, g):
        return g


class ScatterToParallelRegion(_Mapping):
    """Keep this rank's chunk of ``dim``; backward all-gathers (the last dim: tensor, dim 1: sequence)."""

    def __init__(self, group, dim, what):
        super().__init__(group, dim)
        self.what = what

    def parallel_forward(self, x):
        return self.split(x)

    def parallel_backward(self, g):
        return self.gather(g)


class GatherFromTensorParallelRegion(_Mapping):
    what = "gather_from_tensor_parallel_region"

    def parallel_forward(self, x):
        return self.gather(x)

    def parallel_backward(self, g):
        return self.split(g)


class GatherFromSequenceParallelRegion(_Mapping):
    what = "gather_from_sequence_parallel_region"

    def parallel_forward(self, x):
        return self.gather(x)

    def parallel_backward(self, g):
        return self.reduce_scatter(g)


class ReduceScatterToSequenceParallelRegion(_Mapping):
    what = "reduce_scatter_to_sequence_parallel_region"

    def parallel_forward(self, x):
        return self.reduce_scatter(x)

    def parallel_backward(self, g):
        return self.gather(g)


# ----------------------------------------------------------------------------------------- public wrappers
def copy_to_tensor_parallel_region(x, group):
    """Identity; the gradient is all-reduced (SUM) over ``group`` (the input of a column-parallel layer)."""
    return CopyToTensorParallelRegion(group).apply(x)


def reduce_from_tensor_parallel_region(x, group):
    """All-reduce (SUM) over ``group``; the gradient passes unchanged (the output of a row-parallel layer)."""
    return ReduceFromTensorParallelRegion(group).apply(x)


def scatter_to_tensor_parallel_region(x, group):
    """This rank's contiguous chunk of the last dim; the gradient is all-gathered along the last dim."""
    return ScatterToParallelRegion(group, -1, "scatter_to_tensor_parallel_region").apply(x)


def gather_from_tensor_parallel_region(x, group):
    """Every rank's ``x`` concatenated along the last dim in rank order; the gradient keeps this rank's chunk."""
    return GatherFromTensorParallelRegion(group, -1).apply(x)


def scatter_to_sequence_parallel_region(x, group, dim=1):
    """This rank's contiguous chunk of ``dim`` (the sequence of (B, T, C)); the gradient is all-gathered."""
    return ScatterToParallelRegion(group, dim, "scatter_to_sequence_parallel_region").apply(x)


def gather_from_sequence_parallel_region(x, group, dim=1):
    """Every rank's sequence chunk concatenated along ``dim``; the gradient is reduce-scattered (SUM) along ``dim``:
    each rank's consumer saw the whole sequence, so a chunk's gradient sums their contributions."""
    return GatherFromSequenceParallelRegion(group, dim).apply(x)


def reduce_scatter_to_sequence_parallel_region(x, group, dim=1):
    """Sum over ``group`` and keep this rank's chunk of ``dim``; the gradient is all-gathered along ``dim``."""
    return ReduceScatterToSequenceParallelRegion(group, dim).apply(x)


__all__ = ["copy_to_tensor_parallel_region", "reduce_from_tensor_parallel_region",
           "scatter_to_tensor_parallel_region", "gather_from_tensor_parallel_region",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region"]
