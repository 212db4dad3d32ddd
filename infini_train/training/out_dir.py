"""Before any work: the run's out_dir and its checkpoints/ must take new files, or the run stops with one message
naming the path (rather than train for hours and fail at the first save)."""
from __future__ import annotations

import os
import tempfile

from .config import ConfigError


def _nearest_existing(path):
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_writable(out_dir):
    """ConfigError unless ``out_dir`` and ``out_dir/checkpoints`` can hold new files. A directory that does not exist
    yet is judged by its nearest existing ancestor (where it would be made). Nothing is left behind: each directory
    is probed with a temporary file, removed at once (permission bits alone do not tell, e.g. for root or on a
    read-only file system)."""
    for path in (out_dir, os.path.join(out_dir, "checkpoints")):
        where = _nearest_existing(os.path.abspath(path))
        problem = None
        if not os.path.isdir(where):
            problem = f"{where} is not a directory" if where != os.path.abspath(path) else "not a directory"
        else:
            try:
                fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=where)
                os.close(fd)
                os.remove(probe)
            except OSError as exc:
                problem = f"{exc.strerror or exc}" + (f" in {where}" if where != os.path.abspath(path) else "")
        if problem:
            key = "out_dir" if path == out_dir else "out_dir (its checkpoints/)"
            raise ConfigError(f"{key}: expected a directory the run can write, got {path!r} ({problem})\n"
                              "HINT: choose another out_dir, or make it writable")
