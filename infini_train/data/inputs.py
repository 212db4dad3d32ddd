"""The input files of prepare_data.py: which files the arguments name, and their documents as the tokenizer
takes them: the exact bytes for the byte tokenizer, strict UTF-8 text for a text tokenizer (GPT-2's BPE).

    files = expand_inputs(["book.txt", "notes/", "src/**/*.py"])    # [InputFile(path, named), ...]
    docs, stats = read_documents(files, tokenizer, max_bytes=1_000_000, split_on="\\n\\n", warn=print)

A file found in a directory or by a glob is skipped, with one warning, when it looks binary: a NUL byte in its
first 8000 bytes, git's test. A file named on its own is taken as it is by the byte tokenizer and is an error
for a text tokenizer. Reading stops after ``max_bytes`` bytes in all; files past that point are not opened.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import NamedTuple

SNIFF_BYTES = 8000  # git's buffer_is_binary() looks for a NUL byte in the first 8000 bytes


class InputError(ValueError):
    """Input that cannot become shards: names the file, what was expected and what was found, with a HINT."""


class InputFile(NamedTuple):
    path: str
    named: bool  # given as a path of its own, not found in a directory or by a glob


@dataclass
class ReadStats:
    files: int = 0  # files whose bytes were taken
    bytes: int = 0  # bytes read from them
    skipped: list = field(default_factory=list)  # (path, why) of the binary files left out
    stopped_at_limit: bool = False  # max_bytes ended the reading before the inputs did


def _walk(directory):
    """Every file below ``directory``, hidden files and directories left out."""
    found = []
    for parent, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(parent, name) for name in names if not name.startswith(".")]
    return found


def expand_inputs(patterns):
    """InputFiles for paths, globs (``**`` recurses) and directories (every file below, hidden ones skipped),
    in the order given, each pattern's matches sorted, each file once. An empty directory adds nothing; a
    glob that matches nothing is an InputError naming it."""
    files = {}
    for pattern in patterns:
        path = os.path.expanduser(pattern)
        if os.path.isfile(path):
            files[path] = True
            continue
        if os.path.isdir(path):
            matches = _walk(path)
        else:
            matches = glob.glob(path, recursive=True)
            if not matches:
                raise InputError(f"no files match {pattern!r}\nHINT: give text files, globs (quote them) or "
                                 "directories; with no inputs the default corpus is used")
        for match in sorted(p for p in matches if os.path.isfile(p)):
            files.setdefault(match, False)
    return [InputFile(path, named) for path, named in files.items()]


def read_head(path, limit=None):
    """(the file's first ``limit`` bytes, all when None; whether bytes were left unread; the offset of the
    first NUL byte among the first SNIFF_BYTES, None when there is none). Reads max(limit, SNIFF_BYTES) + 1
    bytes at most."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
            rest = f.read() if limit is None else f.read(max(0, limit - len(head)) + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})\n"
                         "HINT: check that the path exists and is readable") from None
    data = head + rest
    left = limit is not None and len(data) > limit
    nul = head.find(b"\0")
    return (data[:limit] if left else data), left, (nul if nul >= 0 else None)


def decode_utf8(data, path, cut, tokenizer_name):
    """``data`` as text; an InputError naming the file and byte offset where it is not UTF-8. When ``cut`` (the
    read stopped at a limit), a character the limit split in two is dropped rather than an error."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if cut and exc.reason == "unexpected end of data":
            return data[:exc.start].decode("utf-8")
        raise InputError(f"{path}: not valid UTF-8 at byte offset {exc.start} ({exc.reason}: "
                         f"{data[exc.start:exc.start + 4]!r}), but the {tokenizer_name!r} tokenizer takes text\n"
                         "HINT: use --tokenizer byte, which takes any bytes as they are, or fix the file's encoding "
                         "(e.g. iconv -f latin1 -t utf-8)") from None


def _documents(content, split_on):
    if not split_on:
        return [content] if content else []
    sep = split_on.encode("utf-8") if isinstance(content, bytes) else split_on
    return [piece for piece in content.split(sep) if piece]


def read_documents(files, tokenizer, max_bytes=None, split_on=None, warn=print):
    """(documents, ReadStats): each InputFile's content, cut at ``split_on`` when given, empty ones left out.

    Documents are bytes when the tokenizer takes bytes (``tokenizer.accepts_bytes``), else str decoded strictly
    as UTF-8. At most ``max_bytes`` bytes are read in all. ``warn`` gets one line per binary file skipped."""
    takes_bytes = getattr(tokenizer, "accepts_bytes", False)
    documents, stats = [], ReadStats()
    for file in files:
        limit = None if max_bytes is None else max_bytes - stats.bytes
        if limit is not None and limit <= 0:
            stats.stopped_at_limit = True
            break
        data, cut, nul = read_head(file.path, limit)
        if nul is not None and not file.named:
            why = f"binary (a NUL byte at offset {nul})"
            stats.skipped.append((file.path, why))
            warn(f"warning: skipping {file.path}: {why}")
            continue
        if nul is not None and not takes_bytes:
            raise InputError(f"{file.path}: a binary file (a NUL byte at offset {nul}), but the {tokenizer.name!r} "
                             "tokenizer takes text\nHINT: use --tokenizer byte to take its bytes as they are, or "
                             "leave the file out")
        stats.files += 1
        stats.bytes += len(data)
        stats.stopped_at_limit = cut
        content = data if takes_bytes else decode_utf8(data, file.path, cut, tokenizer.name)
        documents += _documents(content, split_on)
    return documents, stats
