"""Activation recomputation as torch.utils.checkpoint names it: ``checkpoint`` and ``checkpoint_sequential``
(autograd/recompute.py). A run's checkpoints are infini_train.run_state's; the sharded tensor format is
it.distributed.checkpoint (torch's names, all three)."""
from ..autograd.recompute import checkpoint, checkpoint_sequential

__all__ = ["checkpoint", "checkpoint_sequential"]
