"""Sharded checkpoints (``it.distributed.checkpoint``, as torch.distributed.checkpoint): ``save`` writes each rank's
pieces to its own file plus one metadata file; ``load`` fills any layout's pieces from them (resharding).
``get_model_state_dict`` / ``get_optimizer_state_dict`` / ``set_model_state_dict`` / ``set_optimizer_state_dict``
(torch's torch.distributed.checkpoint.state_dict) give and load a model's and its optimizers' state, sharded or
full."""
from ..sharded_tensor import FlatShard, ShardedTensor
from .pieces import LocalPieces, flat_range_boxes
from .state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict, get_state_dict,
                         set_model_state_dict, set_optimizer_state_dict, set_state_dict)
from .storage import METADATA, CheckpointFormatError, load, read_metadata, save, verify

__all__ = ["LocalPieces", "flat_range_boxes", "save", "load", "verify", "read_metadata", "CheckpointFormatError",
           "METADATA", "ShardedTensor", "FlatShard", "StateDictOptions", "get_model_state_dict",
           "get_optimizer_state_dict", "set_model_state_dict", "set_optimizer_state_dict", "get_state_dict",
           "set_state_dict"]
