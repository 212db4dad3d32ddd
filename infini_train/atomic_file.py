"""Files written whole or not at all: a temporary file beside the target, fsynced, then renamed over it."""
from __future__ import annotations

import os
import secrets


def write_atomically(path, write):
    """``write(tmp)`` fills a fresh file beside ``path``; it is fsynced, then renamed over ``path``. On any failure
    (an interrupt included) the temporary file is removed and ``path`` is left as it was."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # reserve the name; umask applies
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomically(path, text):
    """``text`` (str or bytes) as the whole content of ``path``, written with ``write_atomically``; returns path."""
    mode = "wb" if isinstance(text, (bytes, bytearray)) else "w"

    def write(tmp):
        with open(tmp, mode) as f:
            f.write(text)

    write_atomically(path, write)
    return path


__all__ = ["write_atomically", "write_text_atomically"]
