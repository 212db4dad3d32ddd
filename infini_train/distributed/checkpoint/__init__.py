"""Sharded checkpoints (``it.distributed.checkpoint``, as torch.distributed.checkpoint): ``save`` writes each rank's
pieces to its own file plus one metadata file; ``load`` fills any layout's pieces from them (resharding)."""
from .pieces import LocalPieces, flat_range_boxes
from .storage import METADATA, CheckpointFormatError, load, read_metadata, save, verify

__all__ = ["LocalPieces", "flat_range_boxes", "save", "load", "verify", "read_metadata", "CheckpointFormatError",
           "METADATA"]
