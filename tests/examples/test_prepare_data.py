"""prepare_data.py on files: exact bytes, text encodings, binary files, --max-bytes and empty inputs."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from infini_train.data.shards import find_shards, read_shard
from infini_train.data.tokenizer import ByteTokenizer, GPT2Tokenizer, gpt2_available

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "gpt2", "prepare_data.py")
LATIN1 = ("Ein Bär aß Käse.\r\n" * 40).encode("latin-1")  # not UTF-8, with CRLF line ends
BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("prepare_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def text_tokenizer(script, monkeypatch):
    """--tokenizer gpt2 answered by a GPT2Tokenizer over a stand-in encoding (one token per character), so the
    text path runs where tiktoken's files are not cached."""
    class CharEncoding:
        def encode_ordinary(self, text):
            return [ord(c) % 50000 for c in text]

    real = script.get_tokenizer
    monkeypatch.setattr(script, "get_tokenizer",
                        lambda name: GPT2Tokenizer(CharEncoding()) if name == "gpt2" else real(name))


def stream(out_dir):
    """val then train tokens of a preparation, as one array."""
    paths = find_shards(str(out_dir / "val_*.bin")) + find_shards(str(out_dir / "train_*.bin"))
    return np.concatenate([np.asarray(read_shard(p)) for p in paths])


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_byte_shards_hold_the_exact_input_bytes(tmp_path, script):
    (tmp_path / "latin1.txt").write_bytes(LATIN1)
    (tmp_path / "prog.bin").write_bytes(BINARY)
    out = tmp_path / "out"
    assert script.main([str(tmp_path / "latin1.txt"), str(tmp_path / "prog.bin"), "--out-dir", str(out),
                        "--val-tokens", "100"]) == 0
    tokens = stream(out)
    assert len(tokens) == len(LATIN1) + len(BINARY) + 2 and list(np.flatnonzero(tokens == 256)) == [0, len(LATIN1) + 1]
    assert ByteTokenizer().decode_bytes(tokens) == LATIN1 + BINARY


def test_text_tokenizer_rejects_input_that_is_not_utf8(tmp_path, script, text_tokenizer):
    (tmp_path / "latin1.txt").write_bytes(LATIN1)
    with pytest.raises(SystemExit, match=r"error: .*latin1.txt: not valid UTF-8 at byte offset 5 \(invalid "
                                         r"continuation byte: .*\), but the 'gpt2' tokenizer takes text\nHINT: use "
                                         r"--tokenizer byte, which takes any bytes as they are, or fix the file's "
                                         r"encoding"):
        script.main([str(tmp_path / "latin1.txt"), "--tokenizer", "gpt2", "--out-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    (tmp_path / "utf8.txt").write_bytes(LATIN1.decode("latin-1").encode("utf-8"))
    assert script.main([str(tmp_path / "utf8.txt"), "--tokenizer", "gpt2", "--out-dir", str(tmp_path / "ok")]) == 0
    text = LATIN1.decode("latin-1")
    assert stream(tmp_path / "ok").tolist() == [50256] + [ord(c) for c in text]  # CRLF kept


@pytest.mark.skipif(not gpt2_available(), reason="tiktoken's GPT-2 files are not cached")
def test_real_gpt2_tokenizer_rejects_latin1(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(LATIN1)
    proc = run_script(tmp_path / "latin1.txt", "--tokenizer", "gpt2", "--out-dir", tmp_path / "out")
    assert proc.returncode == 1 and "not valid UTF-8 at byte offset 5" in proc.stderr


def test_max_bytes_limits_what_is_read(tmp_path, script):
    (tmp_path / "big.txt").write_bytes(b"0123456789" * 100_000)
    (tmp_path / "later.txt").write_bytes(b"never read")
    out = tmp_path / "out"
    assert script.main([str(tmp_path / "big.txt"), str(tmp_path / "later.txt"), "--max-bytes", "1234",
                        "--out-dir", str(out), "--val-tokens", "10"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_tokens"] == 1234 + 1 and meta["documents"] == 1
    assert ByteTokenizer().decode_bytes(stream(out)) == (b"0123456789" * 124)[:1234]
    with pytest.raises(SystemExit):
        script.main([str(tmp_path / "big.txt"), "--max-bytes", "0", "--out-dir", str(out)])


def test_binary_files_in_a_directory_are_skipped_with_a_warning(tmp_path, script, capsys):
    d = tmp_path / "src"
    d.mkdir()
    (d / "a.py").write_bytes(b"print('hi')\n" * 50)
    (d / "a.pyc").write_bytes(b"\xa7\r\r\n\0\0\0\0" + BINARY)
    (d / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    out = tmp_path / "out"
    assert script.main([str(d), "--out-dir", str(out), "--val-tokens", "10"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: skipping {d / 'a.pyc'}: binary (a NUL byte at offset 4)",
                   f"warning: skipping {d / 'logo.png'}: binary (a NUL byte at offset 8)"]
    assert ByteTokenizer().decode_bytes(stream(out)) == b"print('hi')\n" * 50
    assert json.loads((out / "meta.json").read_text())["documents"] == 1


def test_a_named_binary_file_is_an_error_for_a_text_tokenizer(tmp_path, script, text_tokenizer):
    (tmp_path / "prog.bin").write_bytes(BINARY)
    with pytest.raises(SystemExit, match=r"error: .*prog.bin: a binary file \(a NUL byte at offset 7\), but the "
                                         r"'gpt2' tokenizer takes text\nHINT: use --tokenizer byte"):
        script.main([str(tmp_path / "prog.bin"), "--tokenizer", "gpt2", "--out-dir", str(tmp_path / "out")])


@pytest.mark.parametrize("make", ["empty file", "empty directory", "only binary files"])
def test_empty_inputs_say_they_hold_no_text(tmp_path, make):
    target = tmp_path / "in"
    if make == "empty file":
        target.write_bytes(b"")
    else:
        target.mkdir()
        if make == "only binary files":
            (target / "x.bin").write_bytes(BINARY)
    proc = run_script(target, "--out-dir", tmp_path / "out")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-2] == f"error: the inputs hold no text: {str(target)!r}" + (
        " (1 binary file(s) skipped)" if make == "only binary files" else "")
    assert proc.stderr.splitlines()[-1].startswith("HINT: give non-empty files")
    assert not (tmp_path / "out").exists()
