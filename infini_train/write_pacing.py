"""Paced writes: a background checkpoint writer spreads its file writes over a time budget instead of taking the
cores in one burst. ``write_blocks`` writes a file's blocks (updating a digest); on a thread inside ``paced(total,
seconds)`` it writes in slices and sleeps whenever it is ahead of ``total`` bytes in ``seconds``. Elsewhere it is a
plain write of each block (one thread-local lookup per file)."""
from __future__ import annotations

import contextlib
import threading
import time

SLICE = 8 << 20  # bytes written between two looks at the schedule
_local = threading.local()


class _Pacer:
    def __init__(self, total, seconds):
        self.rate = max(total, 1) / seconds  # bytes per second
        self.start, self.done = time.monotonic(), 0

    def wrote(self, nbytes):
        self.done += nbytes
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


@contextlib.contextmanager
def paced(total, seconds):
    """Writes by ``write_blocks`` on this thread take at least ``seconds`` for ``total`` bytes (None or 0 seconds:
    unpaced)."""
    _local.pacer = _Pacer(total, seconds) if seconds else None
    try:
        yield
    finally:
        _local.pacer = None


def write_blocks(f, blocks, digest=None):
    """Write each of ``blocks`` (bytes-like) to the open file ``f``, updating ``digest`` (a hashlib object)."""
    pacer = getattr(_local, "pacer", None)
    for block in blocks:
        if pacer is None:
            f.write(block)
            if digest is not None:
                digest.update(block)
            continue
        view = memoryview(block).cast("B")
        for start in range(0, len(view), SLICE):
            piece = view[start:start + SLICE]
            f.write(piece)
            if digest is not None:
                digest.update(piece)
            pacer.wrote(len(piece))


__all__ = ["paced", "write_blocks", "SLICE"]
