"""Stop signals: SIGTERM, SIGINT and SIGUSR1 ask a run to stop at the next step boundary with a checkpoint.

A handler only records the signal. At each step boundary the ranks agree on it with one small all-reduce (MAX
of the signal number), so a signal delivered to any one rank stops every rank at the same step. A second SIGINT
exits at once, without a checkpoint. The run then exits with ``EXIT_STOPPED``, which launchers read as
"checkpoint written, resume later" (launch/run.sh does not restart it; launch/slurm.sbatch requeues it).
"""
from __future__ import annotations

import os
import signal
import sys

import numpy as np

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request after a checkpoint; resume=auto continues bitwise
EXIT_INTERRUPTED = 130  # a second SIGINT: stopped at once, no checkpoint
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class StopSignals:
    """Records the stop signals this process receives while installed (``with StopSignals() as stops:``)."""

    def __init__(self, names=STOP_SIGNALS):
        self.numbers = [getattr(signal, n) for n in names if hasattr(signal, n)]
        self.received = 0  # the first stop signal's number
        self.interrupts = 0
        self._previous = {}

    def __enter__(self):
        for number in self.numbers:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        return False

    def _handle(self, number, frame):
        if number == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts > 1:
                sys.stderr.write("interrupted twice: exiting now, without a checkpoint\n")
                sys.stderr.flush()
                _exit_job(EXIT_INTERRUPTED)
        if not self.received:
            self.received = number
            sys.stderr.write(f"received {signal.Signals(number).name}: stopping at the next step boundary with a "
                             "checkpoint (a second SIGINT exits at once)\n")
            sys.stderr.flush()

    def agreed(self, group=None):
        """The stop signal any rank received (0 when none): the same answer on every rank."""
        from .. import distributed as dist

        if dist.get_world_size(group) == 1:
            return self.received
        flag = _host_tensor(self.received)
        dist.all_reduce(flag, dist.ReduceOp.MAX, group=group)
        return int(flag.numpy()[0])


def signal_name(number):
    return signal.Signals(number).name


def _host_tensor(value):
    from ..tensor import Tensor

    return Tensor(np.array([value], np.int64))


def _exit_job(status):
    """End this process (and, under MPI, the whole job) at once."""
    from ..distributed import launch_utils

    MPI = launch_utils.import_mpi()
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        MPI.COMM_WORLD.Abort(status)
    os._exit(status)
