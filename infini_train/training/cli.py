"""The command line of a training script: parse the config, join the job's world, run, and turn the outcome
into the process exit status.

Exit statuses: 0 the run finished; 75 (EXIT_STOPPED) stopped by SIGTERM / SIGINT / SIGUSR1 after writing a
checkpoint, so ``resume=auto`` continues it; 1 a config, data, checkpoint or divergence error (one message, and under
MPI the whole job is aborted at once so no rank waits for a peer that is gone); 130 a second SIGINT.
"""
from __future__ import annotations

import sys
import time

from .. import distributed as dist
from ..distributed.launch_utils import import_mpi, launcher_world_size
from ..data.shards import ShardError
from ..distributed.mesh import MeshError
from ..models.tensor_parallel_lm import TensorParallelError
from ..optim.offload import OffloadError
from ..run_state import CheckpointError
from .config import ConfigError, parse_args
from .config.checks import backend_problem
from .loop import Run, TrainingDiverged
from .signals import StopSignals


PEER_REPORT_DELAY = 3.0  # seconds a rank other than 0 waits before printing an error rank 0 likely reports too


class _ReportedConfigError(Exception):
    """Every rank's configuration was checked and the errors printed once: exit 1 without another message."""


def main(argv=None):
    """Run training from command-line arguments (``--config FILE key=value ...``); returns the exit status."""
    with StopSignals() as stops:  # from the start: a stop signal while the run is built stops it at its first step
        cfg = _config_agreed_by_every_rank(argv)
        dist.init_process_group(None if cfg.backend == "auto" else cfg.backend)
        try:
            status = Run(cfg).train(stops)
        except (ConfigError, CheckpointError, ShardError, MeshError, TensorParallelError, TrainingDiverged,
                OffloadError) as exc:
            _report_once(exc)
            if dist.get_world_size() > 1:
                from ..distributed.launch_utils import abort_job

                abort_job(1)
            return 1
        # the ranks leave together: launchers that end a job when its first rank exits (srun --wait, Open MPI's
        # mpirun on a non-zero status such as 75) never cut a peer short
        dist.barrier()
        dist.destroy_process_group()
    return status


def _config_agreed_by_every_rank(argv):
    """``parse_args(argv)``; under a launcher the ranks first exchange their outcome (one allgather), so that a config
    error is printed once, by the lowest failing rank, naming the ranks only where they disagree, and no rank starts
    work while another stops."""
    try:
        cfg = parse_args(argv)
        message = backend_problem(cfg)  # (this rank's hardware: agreed on with the config, printed once)
    except ConfigError as exc:
        cfg, message = None, str(exc)
    MPI = import_mpi() if (launcher_world_size() or 1) > 1 else None
    if MPI is None:
        if message is not None:
            raise ConfigError(message)
        return cfg
    messages = MPI.COMM_WORLD.allgather(message)
    failed = {}
    for rank, text in enumerate(messages):
        if text is not None:
            failed.setdefault(text, []).append(rank)
    if not failed:
        return cfg
    if MPI.COMM_WORLD.Get_rank() == min(min(ranks) for ranks in failed.values()):
        for text, ranks in failed.items():
            where = "" if len(ranks) == len(messages) else f"[rank{'s' if len(ranks) > 1 else ''} " \
                                                           f"{', '.join(map(str, ranks))}] "
            print(f"{where}error: {text}", file=sys.stderr, flush=True)
    raise _ReportedConfigError()


def _report_once(exc):
    """Print ``exc``: at once on rank 0; on another rank after PEER_REPORT_DELAY, unless rank 0 (failing the same
    way, as config and checkpoint errors do on every rank) ended the job first."""
    rank = dist.get_rank() if dist.get_world_size() > 1 else 0
    if rank:
        time.sleep(PEER_REPORT_DELAY)
    print(f"{f'[rank {rank}] ' if rank else ''}error: {exc}", file=sys.stderr, flush=True)


def run_script(argv=None):
    """``sys.exit(run_script())`` from a script's ``__main__``: config errors found before the world starts
    print one message and exit 1."""
    try:
        return main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except _ReportedConfigError:
        return 1
