"""What this rank is blocked on right now, for hang reports: work.py sets ``waiting`` around every Work.wait and
hang.py reads it (the watchdog answers another rank's request with it)."""
from __future__ import annotations

waiting = None  # (Work, time.monotonic() when its wait began) while a wait is in progress


def human_bytes(nbytes):
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


__all__ = ["waiting", "human_bytes"]
