"""Tokenizers: a byte-level tokenizer (256 byte values + EOT) that works everywhere, GPT-2's BPE through
tiktoken where its encoding files are available offline, and any Hugging Face tokenizer as ``hf:PATH``
(infini_train.data.hf_tokenizer: a model directory or its tokenizer.json, with chat templates).

tiktoken downloads GPT-2's ``vocab.bpe`` and ``encoder.json`` on first use and caches them (in
``$TIKTOKEN_CACHE_DIR``, else ``$DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``; files named by the sha1
of their URL). This module never waits on a network: GPT-2 counts as available only when tiktoken is
installed and both files already sit in that cache with the right sha256, and then it is loaded from
exactly that directory, so tiktoken finds them and makes no request.

    tok = get_tokenizer("auto")          # "gpt2" when available offline, else "byte"
    tok = get_tokenizer("hf:models/Qwen2.5-0.5B-Instruct")   # HFTokenizer: also apply_chat_template
    ids = tok.encode("hello")            # list[int]; the byte tokenizer also takes bytes (tok.accepts_bytes)
    text = tok.decode(ids)               # str; invalid UTF-8 becomes U+FFFD
    tok.name, tok.vocab_size, tok.eot_token
"""
from __future__ import annotations

import difflib
import hashlib
import os
import tempfile
import threading

import numpy as np

TOKENIZERS = ("byte", "gpt2", "auto")
TOKENIZER_VOCAB = {"byte": 257, "gpt2": 50257}  # the ids each named tokenizer gives: the smallest model vocab_size
HF_PREFIX = "hf:"  # hf:PATH, PATH a Hugging Face model directory or its tokenizer.json
EOT_TEXT = "<|endoftext|>"

# tiktoken's GPT-2 files: (URL used by tiktoken >= 0.5, URL used before, sha256 of the content)
GPT2_FILES = (
    ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
     "az://openaipublic/gpt-2/encodings/main/vocab.bpe",
     "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
    ("https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
     "az://openaipublic/gpt-2/encodings/main/encoder.json",
     "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
)


def _as_bytes(text):
    return bytes(text) if isinstance(text, (bytes, bytearray, memoryview)) else text.encode("utf-8")


class ByteTokenizer:
    """Bytes as tokens 0..255, end-of-text 256: vocab_size 257. Needs nothing, loses nothing: it takes str
    (encoded as UTF-8) or any bytes, binary included (``accepts_bytes``)."""

    name = "byte"
    vocab_size = 257
    eot_token = 256
    accepts_bytes = True

    def encode(self, text):
        return list(_as_bytes(text))

    def encode_array(self, text):
        """encode() as a uint16 array, without building a Python list (fast for large texts)."""
        return np.frombuffer(_as_bytes(text), dtype=np.uint8).astype(np.uint16)

    def decode_bytes(self, tokens):
        """The exact bytes of the ids 0..255 in ``tokens``; EOT and ids outside the vocab are left out."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        return ids[(ids >= 0) & (ids < 256)].astype(np.uint8).tobytes()

    def decode(self, tokens):
        """Bytes to text (errors="replace"); EOT shows as <|endoftext|>, ids outside the vocab as U+FFFD."""
        parts, chunk = [], bytearray()
        for t in tokens:
            t = int(t)
            if 0 <= t < 256:
                chunk.append(t)
                continue
            parts.append(chunk.decode("utf-8", errors="replace"))
            parts.append(EOT_TEXT if t == self.eot_token else "\ufffd")
            chunk = bytearray()
        parts.append(chunk.decode("utf-8", errors="replace"))
        return "".join(parts)

    def __repr__(self):
        return "ByteTokenizer(vocab_size=257, eot_token=256)"


class GPT2Tokenizer:
    """OpenAI's GPT-2 BPE through tiktoken: vocab_size 50257, end-of-text 50256. Build with get_tokenizer."""

    name = "gpt2"
    vocab_size = 50257
    eot_token = 50256
    accepts_bytes = False  # text only: input must be valid UTF-8

    def __init__(self, encoding):
        self.enc = encoding

    def encode(self, text):
        # ordinary: "<|endoftext|>" inside a text is text, as in llm.c's data scripts
        return self.enc.encode_ordinary(text)

    def encode_array(self, text):
        return np.asarray(self.enc.encode_ordinary(text), dtype=np.uint16)

    def decode(self, tokens):
        """Token ids to text (errors="replace"); ids outside the vocab (padded rows) show as U+FFFD."""
        ids = [int(t) for t in tokens]
        if all(0 <= t < self.vocab_size for t in ids):
            return self.enc.decode(ids, errors="replace")
        parts, run = [], []
        for t in ids:
            if 0 <= t < self.vocab_size:
                run.append(t)
            else:
                parts += [self.enc.decode(run, errors="replace"), "\ufffd"]
                run = []
        parts.append(self.enc.decode(run, errors="replace"))
        return "".join(parts)

    def __repr__(self):
        return "GPT2Tokenizer(vocab_size=50257, eot_token=50256)"


def tiktoken_cache_dir():
    """The directory tiktoken reads its cached files from ("" means caching is off)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _installed_gpt2_source():
    """The text of the installed tiktoken's GPT-2 constructor module ("" when tiktoken is missing)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("tiktoken_ext.openai_public")
    except ImportError:
        return ""
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def _cached_gpt2_dir():
    """The cache directory holding both GPT-2 files, under the URLs the installed tiktoken requests and with
    the right sha256, or None. Reads local files only."""
    cache = tiktoken_cache_dir()
    if not cache or not os.path.isdir(cache):
        return None
    source = _installed_gpt2_source()
    for urls_and_hash in GPT2_FILES:
        urls = [url for url in urls_and_hash[:2] if url in source]  # a version we do not know: not available
        if not urls:
            return None
        path = os.path.join(cache, hashlib.sha1(urls[0].encode()).hexdigest())
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != urls_and_hash[2]:
                return None  # tiktoken would delete it and download again
    return cache


def _has_tiktoken():
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


def gpt2_available():
    """True when tiktoken is installed and GPT-2's files are cached (loading it needs no network)."""
    return _has_tiktoken() and _cached_gpt2_dir() is not None


_GPT2 = None
_GPT2_LOCK = threading.Lock()


def _load_gpt2():
    global _GPT2
    with _GPT2_LOCK:
        if _GPT2 is None:
            cache = _cached_gpt2_dir() if _has_tiktoken() else None
            if cache is None:
                why = (f"its cache directory {tiktoken_cache_dir()!r} lacks GPT-2's vocab.bpe and encoder.json"
                       if _has_tiktoken() else "tiktoken is not installed")
                raise RuntimeError(
                    f"tokenizer 'gpt2': expected tiktoken's GPT-2 encoding to be available offline, but {why}\n"
                    "HINT: pip install -e '.[tokenizers]' and run tiktoken.get_encoding('gpt2') once with network "
                    "access (TIKTOKEN_CACHE_DIR picks where it caches), or use data.tokenizer=byte")
            import tiktoken

            saved = os.environ.get("TIKTOKEN_CACHE_DIR")
            os.environ["TIKTOKEN_CACHE_DIR"] = cache  # the directory just verified: tiktoken cannot miss it
            try:
                _GPT2 = GPT2Tokenizer(tiktoken.get_encoding("gpt2"))
            finally:
                if saved is None:
                    del os.environ["TIKTOKEN_CACHE_DIR"]
                else:
                    os.environ["TIKTOKEN_CACHE_DIR"] = saved
        return _GPT2


def hf_name(path):
    """The name an ``hf:`` tokenizer records (in shards' meta.json, checkpoints): "hf:" + the absolute path, so a
    run or generate.py started elsewhere rebuilds the same tokenizer."""
    return HF_PREFIX + os.path.abspath(os.path.expanduser(path)) if path else HF_PREFIX


def get_tokenizer(name="auto"):
    """"byte", "gpt2", "auto" (gpt2 when available offline, else byte) or "hf:PATH" (an HFTokenizer) -> tokenizer
    instance."""
    if isinstance(name, str) and name.startswith(HF_PREFIX):
        from .hf_tokenizer import HFTokenizer  # needs the tokenizers package: imported only for hf: names

        return HFTokenizer(name[len(HF_PREFIX):])
    if name == "auto":
        name = "gpt2" if gpt2_available() else "byte"
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return _load_gpt2()
    close = difflib.get_close_matches(str(name), TOKENIZERS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown tokenizer {name!r}: expected one of {TOKENIZERS}\nHINT: {hint}"
                     "byte works offline everywhere; gpt2 needs tiktoken and its cached encoding; hf:PATH reads a "
                     "Hugging Face model directory's tokenizer.json")
