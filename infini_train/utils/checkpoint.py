"""Activation recomputation as torch.utils.checkpoint names it: ``checkpoint`` and ``checkpoint_sequential``
(autograd/recompute.py). A run's checkpoint files are the run package's (infini_train.training.checkpoints)."""
from ..autograd.recompute import checkpoint, checkpoint_sequential

__all__ = ["checkpoint", "checkpoint_sequential"]
