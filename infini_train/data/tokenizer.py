"""Tokenizers: a byte-level tokenizer (256 byte values + EOT) that works everywhere, and GPT-2's BPE via
tiktoken where its encoding files are available offline (tiktoken downloads them on first use, and this
runtime never waits on a network)."""
from __future__ import annotations

import hashlib
import os
import tempfile

GPT2_FILES = ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
              "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json")


class ByteTokenizer:
    name = "byte"
    vocab_size = 257
    eot_token = 256

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, tokens):
        return bytes(int(t) for t in tokens if 0 <= int(t) < 256).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    name = "gpt2"
    vocab_size = 50257
    eot_token = 50256

    def __init__(self):
        import tiktoken
        self.enc = tiktoken.get_encoding("gpt2")

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def decode(self, tokens):
        return self.enc.decode([int(t) for t in tokens])


def gpt2_available():
    """True when tiktoken is installed and its GPT-2 files are already cached (no download needed)."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return all(os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())) for url in GPT2_FILES)


def get_tokenizer(name="auto"):
    if name == "auto":
        name = "gpt2" if gpt2_available() else "byte"
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        if not gpt2_available():
            raise RuntimeError("tokenizer 'gpt2': tiktoken's GPT-2 encoding is not available offline\n"
                               "HINT: pip install -e '.[tokenizers]' and cache the encoding once with network "
                               "access (set TIKTOKEN_CACHE_DIR), or use data.tokenizer=byte")
        return GPT2Tokenizer()
    raise ValueError(f"unknown tokenizer {name!r}: expected 'byte', 'gpt2' or 'auto'")
