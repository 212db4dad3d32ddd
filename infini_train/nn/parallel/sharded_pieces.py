"""A rank's tensors as pieces of the whole tensors, for sharded checkpoints (it.distributed.checkpoint): a
tensor-parallel shard (ShardSpec) is one box per block along its split dim, the zero padding of a split vocabulary
left out; a ZeRO piece is a flat range of the rank's (possibly tensor-parallel) shard, so a few boxes of it, each
mapped through the shard's spec in turn. Saving writes those boxes; loading fills them from whatever layout wrote.
"""
from __future__ import annotations

from ...distributed.checkpoint import LocalPieces


def whole_shape(local_shape, spec, size):
    """The whole tensor's shape (padding dropped) of a shard of ``local_shape`` split as ``spec`` over ``size``."""
    if spec is None or size == 1 and spec.whole_size is None:
        return tuple(local_shape)
    dim = spec.dim % len(local_shape)
    length = spec.whole_size if spec.whole_size is not None else local_shape[dim] * size
    return tuple(local_shape[:dim]) + (length,) + tuple(local_shape[dim + 1:])


def _segments(spec, rank, size, local_length, whole_length):
    """(local start, whole start, length) along the split dim: part ``rank`` of each block, padding cut off."""
    part = local_length // spec.blocks
    block = part * size
    out = []
    for b in range(spec.blocks):
        start = b * block + rank * part
        n = min(part, whole_length - start)
        if n > 0:
            out.append((b * part, start, n))
    return out


def shard_pieces(local_shape, spec, rank, size, boxes):
    """LocalPieces of the whole tensor for local ``boxes`` [(offsets in the shard, view)] of a shard of
    ``local_shape`` split as ``spec`` (None: not split) over a group of ``size`` where this rank is ``rank``."""
    shape = whole_shape(local_shape, spec, size)
    dtype = boxes[0][1].dtype if boxes else None
    if spec is None or (size == 1 and spec.whole_size is None):
        return LocalPieces(shape, dtype, [(tuple(o), v) for o, v in boxes])
    dim = spec.dim % len(local_shape)
    pieces = []
    for offsets, view in boxes:
        lo, hi = offsets[dim], offsets[dim] + view.shape[dim]
        for local_start, whole_start, n in _segments(spec, rank, size, local_shape[dim], shape[dim]):
            a, b = max(lo, local_start), min(hi, local_start + n)
            if a >= b:
                continue
            cut = [slice(None)] * view.ndim
            cut[dim] = slice(a - lo, b - lo)
            where = list(offsets)
            where[dim] = whole_start + (a - local_start)
            pieces.append((tuple(where), view[tuple(cut)]))
    return LocalPieces(shape, dtype, pieces)


def tensor_pieces(array, spec=None, rank=0, size=1):
    """The pieces of a whole tensor that this rank's ``array`` (its whole shard) holds."""
    return shard_pieces(tuple(array.shape), spec, rank, size, [((0,) * array.ndim, array)])


def flat_pieces(local_shape, flat_view, flat_start, spec=None, rank=0, size=1):
    """The pieces held by ``flat_view``: elements [flat_start, flat_start + size) of this rank's flattened shard
    of ``local_shape`` (a ZeRO piece)."""
    boxes = LocalPieces.flat_range(local_shape, flat_start, flat_view).pieces  # boxes of this rank's shard
    pieces = shard_pieces(tuple(local_shape), spec, rank, size, boxes)
    pieces.dtype = flat_view.dtype
    return pieces


def param_pieces(p, rank=0, size=1):
    """The pieces of the whole tensor that this rank holds of ``p`` (a parameter or buffer): its values split by its
    placement's tensor shard, or, for a parameter fully_shard keeps sharded, its flat piece of that."""
    spec, flat_shard = p.placement.tensor_shard, p.placement.flat_shard
    if flat_shard is None:
        return tensor_pieces(p.array, spec, rank, size)
    piece = flat_shard.local_piece(p)
    if piece is None:
        return LocalPieces(whole_shape(tuple(p.shape), spec, size), flat_shard.dtype, [])
    start, view = piece
    return flat_pieces(tuple(p.shape), view, start, spec, rank, size)


__all__ = ["whole_shape", "shard_pieces", "tensor_pieces", "flat_pieces", "param_pieces"]
