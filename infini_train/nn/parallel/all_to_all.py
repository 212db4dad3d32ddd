"""All-to-all over a group as an autograd Op (the token dispatch of expert parallelism, as Megatron-Core's MoE
token dispatcher): forward ``dist.all_to_all_single``, backward the opposite all-to-all.

    all_to_all(x, output_split_sizes, input_split_sizes, group)
        forward:  block j of x (input_split_sizes[j] rows of dim 0) goes to rank j; the output holds the blocks
                  every rank sent this one, in rank order (output_split_sizes[j] rows from rank j)
        backward: the gradient goes back the same way with the split lists swapped: block j of the output's
                  gradient returns to rank j, which puts it where its rows came from

Each row is moved, never combined, so the backward is the forward's transpose exactly. None splits dim 0 evenly.
The Op never writes into the arrays it is handed (inputs and incoming gradients may be shared): both directions
receive into fresh arrays.
"""
from __future__ import annotations

from ...autograd.function import Op
from ...distributed import default_group


def all_to_all_array(xp, array, group, output_split_sizes, input_split_sizes):
    """A new array: ``array``'s blocks of rows exchanged over ``group`` (``dist.all_to_all_single``)."""
    if output_split_sizes is None:
        rows = array.shape[0] if array.ndim else 0
    else:
        try:
            rows = max(0, int(sum(output_split_sizes)))
        except (TypeError, ValueError):  # not a list of counts: the collective explains what it expects
            rows = 0
    out = xp.empty((rows,) + tuple(array.shape[1:]), dtype=array.dtype)
    group.all_to_all_single(out, array, output_split_sizes, input_split_sizes)
    return out


class AllToAll(Op):
    """``all_to_all_single`` forward; the same exchange with the split lists swapped backward."""

    def __init__(self, group, output_split_sizes=None, input_split_sizes=None):
        self.group = group if group is not None else default_group()
        self.output_split_sizes = _as_list(output_split_sizes)
        self.input_split_sizes = _as_list(input_split_sizes)

    def forward(self, x):
        return all_to_all_array(self.xp, x, self.group, self.output_split_sizes, self.input_split_sizes)

    def backward(self, g):
        return all_to_all_array(self.xp, g, self.group, self.input_split_sizes, self.output_split_sizes)


def _as_list(splits):
    """Split sizes as a list of ints (a numpy array or tensor of counts is accepted); None and anything else are
    left for the collective to check."""
    if hasattr(splits, "tolist"):
        return splits.tolist()
    return list(splits) if isinstance(splits, (list, tuple, range)) else splits


def all_to_all(input, output_split_sizes=None, input_split_sizes=None, group=None):
    """A new tensor: ``input``'s dim-0 blocks exchanged over ``group`` (rank j gets ``input_split_sizes[j]`` rows;
    this rank receives ``output_split_sizes[j]`` rows from rank j, in rank order; None: equal blocks). Its gradient
    flows back through the opposite all-to-all (the split lists swapped). Every rank of ``group`` must call it."""
    return AllToAll(group, output_split_sizes, input_split_sizes).apply(input)


__all__ = ["all_to_all", "all_to_all_array", "AllToAll"]
