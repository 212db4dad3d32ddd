import hashlib
import sys
import time
import types

import numpy as np
import pytest

from infini_train.data import tokenizer as tokmod
from infini_train.data.tokenizer import ByteTokenizer, get_tokenizer, gpt2_available


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    assert (tok.name, tok.vocab_size, tok.eot_token) == ("byte", 257, 256)
    text = "héllo, wörld ✓ 𝛑\n\tdef f(x): return x  # comment"
    ids = tok.encode(text)
    assert isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < 256 for i in ids)
    assert ids[:2] == [ord("h"), 0xC3] and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    np.testing.assert_array_equal(tok.encode_array(text), ids)
    assert tok.encode_array(text).dtype == np.uint16
    assert tok.decode(np.array(ids, dtype=np.int64)) == text  # numpy ids too


def test_byte_decode_shows_eot_and_replaces_invalid_bytes():
    tok = ByteTokenizer()
    assert tok.decode([104, 105, 256, 111]) == "hi<|endoftext|>o"
    assert tok.decode([0xC3]) == "\ufffd"  # a cut multi-byte character: errors="replace"
    assert tok.decode([104, 300]) == "h\ufffd"  # padded-vocab ids a model may sample
    assert tok.decode([]) == ""


def test_get_tokenizer_names():
    assert isinstance(get_tokenizer("byte"), ByteTokenizer)
    assert get_tokenizer("auto").name == ("gpt2" if gpt2_available() else "byte")
    with pytest.raises(ValueError, match=r"unknown tokenizer 'bytes': expected one of \('byte', 'gpt2', 'auto'\)"
                                         r"\nHINT: did you mean 'byte'\?"):
        get_tokenizer("bytes")


def test_gpt2_unavailable_offline_fails_fast_and_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setattr(tokmod, "_GPT2", None)
    t0 = time.perf_counter()
    assert not gpt2_available()
    assert get_tokenizer("auto").name == "byte"
    with pytest.raises(RuntimeError, match="tokenizer 'gpt2': expected tiktoken's GPT-2 encoding to be available "
                                           "offline, but .*\nHINT: .*data.tokenizer=byte"):
        get_tokenizer("gpt2")
    assert time.perf_counter() - t0 < 2.0  # never waits on a network


@pytest.fixture
def fake_tiktoken(tmp_path, monkeypatch):
    """A stand-in tiktoken whose GPT-2 module names the real URLs and whose get_encoding records the cache dir
    it was called with; the expected sha256 are those of fake file contents."""
    pkg = tmp_path / "site"
    (pkg / "tiktoken_ext").mkdir(parents=True)
    new_url, old_url, _ = tokmod.GPT2_FILES[0]
    new_url2, old_url2, _ = tokmod.GPT2_FILES[1]
    (pkg / "tiktoken_ext" / "__init__.py").write_text("")
    (pkg / "tiktoken_ext" / "openai_public.py").write_text(f"URLS = [{new_url!r}, {new_url2!r}]\n")
    calls = []

    class FakeEncoding:
        def encode_ordinary(self, text):
            return [ord(c) for c in text]

        def decode(self, ids, errors="strict"):
            return "".join(chr(i) for i in ids)

    fake = types.ModuleType("tiktoken")

    def get_encoding(name):
        import os
        calls.append((name, os.environ.get("TIKTOKEN_CACHE_DIR")))
        return FakeEncoding()

    fake.get_encoding = get_encoding
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.syspath_prepend(str(pkg))
    for mod in [m for m in sys.modules if m.startswith("tiktoken_ext")]:
        monkeypatch.delitem(sys.modules, mod)
    contents = [b"fake vocab.bpe", b"fake encoder.json"]
    monkeypatch.setattr(tokmod, "GPT2_FILES", tuple(
        (new, old, hashlib.sha256(c).hexdigest()) for (new, old, _), c in zip(tokmod.GPT2_FILES, contents)))
    monkeypatch.setattr(tokmod, "_GPT2", None)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    return cache, [(new_url, contents[0]), (new_url2, contents[1])], calls


def test_gpt2_needs_both_files_cached_with_the_right_content(fake_tiktoken):
    cache, files, calls = fake_tiktoken
    assert not gpt2_available()
    (url, content), (url2, content2) = files
    (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(content)
    assert not gpt2_available()  # encoder.json still missing
    (cache / hashlib.sha1(url2.encode()).hexdigest()).write_bytes(b"corrupt")
    assert not gpt2_available()  # tiktoken would delete it and download again
    (cache / hashlib.sha1(url2.encode()).hexdigest()).write_bytes(content2)
    assert gpt2_available() and calls == []  # checking loads nothing


def test_gpt2_loads_from_the_verified_cache(fake_tiktoken, monkeypatch):
    cache, files, calls = fake_tiktoken
    for url, content in files:
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(content)
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(cache))
    tok = get_tokenizer("auto")
    assert (tok.name, tok.vocab_size, tok.eot_token) == ("gpt2", 50257, 50256)
    assert calls == [("gpt2", str(cache))]  # tiktoken was pointed at exactly the verified directory
    import os
    assert "TIKTOKEN_CACHE_DIR" not in os.environ  # and the environment restored
    assert tok.decode(tok.encode("abc")) == "abc"
    assert tok.decode([97, 60000, 98]) == "a\ufffdb"
    assert get_tokenizer("gpt2") is tok and len(calls) == 1  # loaded once per process


def test_byte_tokenizer_takes_any_bytes_and_gives_them_back_exactly():
    tok = ByteTokenizer()
    data = bytes(range(256)) + b"\r\n\xff\xfe latin-1: caf\xe9"  # NUL, invalid UTF-8, CRLF: all kept
    assert tok.accepts_bytes and not tokmod.GPT2Tokenizer.accepts_bytes
    assert tok.encode(data) == list(data)
    np.testing.assert_array_equal(tok.encode_array(data), np.frombuffer(data, np.uint8))
    assert tok.decode_bytes(tok.encode_array(data)) == data
    assert tok.decode_bytes([104, 256, 105, 300]) == b"hi"  # EOT and ids outside the vocab are left out
    assert tok.encode(bytearray(b"ab")) == tok.encode("ab") == [97, 98]
