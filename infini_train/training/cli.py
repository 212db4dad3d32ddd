"""The command line of a training script: parse the config, join the job's world, run, and turn the outcome
into the process exit status.

Exit statuses: 0 the run finished; 75 (EXIT_STOPPED) stopped by SIGTERM / SIGINT / SIGUSR1 after writing a
checkpoint, so ``resume=auto`` continues it; 1 a config, data, checkpoint or divergence error (one message, and under
MPI the whole job is aborted at once so no rank waits for a peer that is gone); 130 a second SIGINT.
"""
from __future__ import annotations

import sys

from .. import distributed as dist
from ..data.shards import ShardError
from ..distributed.mesh import MeshError
from ..models.tensor_parallel_lm import TensorParallelError
from ..utils.checkpoint import CheckpointError
from ..utils.config import ConfigError, parse_args
from .loop import Run, TrainingDiverged


def main(argv=None):
    """Run training from command-line arguments (``--config FILE key=value ...``); returns the exit status."""
    cfg = parse_args(argv)
    dist.init_process_group(None if cfg.backend == "auto" else cfg.backend)
    try:
        status = Run(cfg).train()
    except (ConfigError, CheckpointError, ShardError, MeshError, TensorParallelError, TrainingDiverged) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if dist.get_world_size() > 1:
            from ..distributed.launch_utils import abort_job

            abort_job(1)
        return 1
    dist.destroy_process_group()
    return status


def run_script(argv=None):
    """``sys.exit(run_script())`` from a script's ``__main__``: config errors found before the world starts
    print one message and exit 1."""
    try:
        return main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
