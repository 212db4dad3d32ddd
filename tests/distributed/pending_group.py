"""A process group of world ranks [0, 1] in one process whose collectives and transfers never complete (this is rank
0; rank 1 never arrives): the numbering and hang-report paths of a real group, without MPI."""
from infini_train.distributed import ProcessGroup, Work


class PendingGroup(ProcessGroup):
    backend = "test"

    def __init__(self, timeout=300.0):
        super().__init__([0, 1], 0, timeout)

    def _pending(self, name):
        return Work(self, name, _never)

    def _all_reduce(self, arr, op):
        return self._pending("all_reduce")

    def _broadcast(self, arr, src):
        return self._pending("broadcast")

    def _send(self, arr, dst, tag):
        return self._pending(f"send to {dst}")

    def _recv(self, arr, src, tag):
        return self._pending(f"recv from {src}")


def _never():
    return False
