import builtins
import os

import pytest

from infini_train.data import inputs
from infini_train.data.inputs import InputError, InputFile, expand_inputs, read_documents, read_head
from infini_train.data.tokenizer import ByteTokenizer

LATIN1 = "café, naïve\r\n".encode("latin-1")  # not UTF-8: b"\xe9" at byte offset 3
BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4


class TextTokenizer:
    """A tokenizer that takes text only, as GPT-2's BPE does."""

    name = "text"
    accepts_bytes = False


@pytest.fixture
def read_sizes(monkeypatch):
    """Bytes read per file by the inputs module: {path: total}."""
    sizes = {}

    class Counting:
        def __init__(self, f, path):
            self.f, self.path = f, path

        def read(self, n=-1):
            data = self.f.read(n)
            sizes[self.path] = sizes.get(self.path, 0) + len(data)
            return data

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(inputs, "open", lambda path, mode="r": Counting(builtins.open(path, mode), path),
                        raising=False)
    return sizes


def test_expand_inputs_marks_named_files_and_finds_the_rest(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("b")
    (tmp_path / "d" / "sub" / "a.txt").write_text("a")
    (tmp_path / "d" / ".hidden").write_text("h")
    (tmp_path / "empty").mkdir()
    (tmp_path / "odd[1].txt").write_text("o")  # a name glob would read as a pattern
    files = expand_inputs([str(tmp_path / "odd[1].txt"), str(tmp_path / "d"), str(tmp_path / "d" / "*.txt"),
                           str(tmp_path / "empty")])
    assert [(os.path.relpath(f.path, tmp_path), f.named) for f in files] == [
        ("odd[1].txt", True), ("d/b.txt", False), ("d/sub/a.txt", False)]
    assert expand_inputs([str(tmp_path / "empty")]) == []
    with pytest.raises(InputError, match=r"no files match '.*none_\*.txt'\nHINT: "):
        expand_inputs([str(tmp_path / "none_*.txt")])


def test_read_head_reads_only_up_to_the_limit(tmp_path, read_sizes):
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * 1_000_000)
    data, cut, nul = read_head(str(path), 100)
    assert (data, cut, nul) == (b"x" * 100, True, None)
    assert read_sizes[str(path)] <= inputs.SNIFF_BYTES + 1  # not the whole megabyte
    data, cut, _ = read_head(str(path), 20_000)
    assert len(data) == 20_000 and cut and read_sizes[str(path)] <= inputs.SNIFF_BYTES + 1 + 20_001
    data, cut, _ = read_head(str(path), 1_000_000)
    assert len(data) == 1_000_000 and not cut
    (tmp_path / "bin").write_bytes(b"abc\0def")
    assert read_head(str(tmp_path / "bin")) == (b"abc\0def", False, 3)
    with pytest.raises(InputError, match=r"missing.txt: cannot be read \(No such file or directory\)\nHINT: "):
        read_head(str(tmp_path / "missing.txt"))


def test_byte_tokenizer_documents_are_the_exact_bytes(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(LATIN1)
    (tmp_path / "prog.bin").write_bytes(BINARY)
    files = [InputFile(str(tmp_path / "latin1.txt"), True), InputFile(str(tmp_path / "prog.bin"), True)]
    docs, stats = read_documents(files, ByteTokenizer())
    assert docs == [LATIN1, BINARY]  # a named binary file is taken as it is
    assert (stats.files, stats.bytes, stats.skipped, stats.stopped_at_limit) == (2, len(LATIN1) + len(BINARY), [],
                                                                                  False)
    docs, _ = read_documents(files[:1], ByteTokenizer(), split_on="\r\n")
    assert docs == [LATIN1[:-2]]


def test_text_tokenizer_rejects_input_that_is_not_utf8_naming_file_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"ok line\n" * 3 + LATIN1)
    with pytest.raises(InputError, match=r"latin1.txt: not valid UTF-8 at byte offset 27 \(invalid continuation "
                                         r"byte: b'\\xe9, n'\), but the 'text' tokenizer takes text\nHINT: use "
                                         r"--tokenizer byte, which takes any bytes"):
        read_documents([InputFile(str(path), True)], TextTokenizer())
    (tmp_path / "prog.bin").write_bytes(BINARY)  # NUL is valid UTF-8: the binary test catches it
    with pytest.raises(InputError, match=r"prog.bin: a binary file \(a NUL byte at offset 7\), but the 'text' "
                                         r"tokenizer takes text\nHINT: use --tokenizer byte"):
        read_documents([InputFile(str(tmp_path / "prog.bin"), True)], TextTokenizer())


def test_text_tokenizer_keeps_crlf_and_drops_a_character_the_limit_cuts(tmp_path):
    path = tmp_path / "u.txt"
    path.write_bytes("ab\r\néé".encode())  # é is 2 bytes: a limit of 5 falls inside the first one
    docs, stats = read_documents([InputFile(str(path), True)], TextTokenizer(), max_bytes=5)
    assert docs == ["ab\r\n"] and stats.bytes == 5 and stats.stopped_at_limit
    docs, _ = read_documents([InputFile(str(path), True)], TextTokenizer())
    assert docs == ["ab\r\néé"]
    path.write_bytes(b"ab\xc3")  # cut off in the file itself, not by the limit: an error
    with pytest.raises(InputError, match="u.txt: not valid UTF-8 at byte offset 2 \\(unexpected end of data"):
        read_documents([InputFile(str(path), True)], TextTokenizer(), max_bytes=100)


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), TextTokenizer()], ids=["byte", "text"])
def test_binary_files_found_in_directories_are_skipped_with_one_warning_each(tmp_path, tokenizer):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (tmp_path / "c.txt").write_bytes(b"x" * 9000 + b"\0")  # a NUL past the first 8000 bytes: text, as for git
    warnings = []
    docs, stats = read_documents(expand_inputs([str(tmp_path)]), tokenizer, warn=warnings.append)
    assert warnings == [f"warning: skipping {tmp_path / 'b.png'}: binary (a NUL byte at offset 8)"]
    assert stats.skipped == [(str(tmp_path / "b.png"), "binary (a NUL byte at offset 8)")]
    expected = [b"alpha", b"x" * 9000 + b"\0"]
    assert docs == (expected if tokenizer.accepts_bytes else [d.decode() for d in expected])
    assert stats.files == 2 and stats.bytes == 5 + 9001


def test_max_bytes_stops_reading_and_opens_no_later_file(tmp_path, read_sizes):
    for name, size in (("a.txt", 3000), ("b.txt", 50_000), ("c.txt", 10)):
        (tmp_path / name).write_bytes(name[0].encode() * size)
    docs, stats = read_documents(expand_inputs([str(tmp_path)]), ByteTokenizer(), max_bytes=4000)
    assert docs == [b"a" * 3000, b"b" * 1000] and stats.bytes == 4000 and stats.stopped_at_limit
    assert str(tmp_path / "c.txt") not in read_sizes  # past the limit: never opened
    assert read_sizes[str(tmp_path / "b.txt")] <= inputs.SNIFF_BYTES + 1
    docs, stats = read_documents(expand_inputs([str(tmp_path)]), ByteTokenizer(), max_bytes=53_010)
    assert [len(d) for d in docs] == [3000, 50_000, 10] and not stats.stopped_at_limit


def test_empty_files_give_no_documents(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "seps.txt").write_bytes(b"\n\n\n\n")
    docs, stats = read_documents(expand_inputs([str(tmp_path)]), ByteTokenizer(), split_on="\n\n")
    assert docs == [] and stats.files == 2 and stats.bytes == 4
