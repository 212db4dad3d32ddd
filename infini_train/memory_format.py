"""Memory formats, as torch names them. Tensors here are row-major (C order) only: ``contiguous_format`` is the one
layout methods taking ``memory_format=`` accept."""
from __future__ import annotations


class memory_format:  # noqa: N801  (torch's name)
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"infini_train.{self.name}"


contiguous_format = memory_format("contiguous_format")
preserve_format = memory_format("preserve_format")
channels_last = memory_format("channels_last")


def check_contiguous_format(op, fmt):
    if fmt is not contiguous_format:
        raise ValueError(f"{op}: expected memory_format=infini_train.contiguous_format, got {fmt!r}\n"
                         f"HINT: tensors here are row-major only; leave memory_format out")


__all__ = ["memory_format", "contiguous_format", "preserve_format", "channels_last"]
