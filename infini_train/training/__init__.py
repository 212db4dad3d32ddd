"""Training runs: the loop and its parts (resume, one optimizer step, evaluation, checkpoints, stop signals),
shared by the example scripts. What a run prints before its first step is described in .startup."""
from .cli import main, run_script
from .loop import Run, TrainingDiverged
from .signals import EXIT_INTERRUPTED, EXIT_STOPPED, StopSignals
from .step import step_seed

__all__ = ["main", "run_script", "Run", "TrainingDiverged", "EXIT_INTERRUPTED", "EXIT_STOPPED", "StopSignals",
           "step_seed"]
