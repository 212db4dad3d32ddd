"""SFT samples: records (infini_train.data.sft_records) rendered and tokenized into token ids plus the mask of
the tokens the loss is trained on.

    table = SampleTable.from_jsonl("data/chat.jsonl", tokenizer, "chat")   # every sample tokenized once
    ids, mask = table[0]               # uint32 ids, uint8 mask (1: an assistant token, or any token of a text)
    sample = make_sample(tokenizer, messages)           # Sample(input_ids, labels): labels -1 where masked

Rendering. Chat and instruction samples go through the tokenizer's chat template,
``tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``
(infini_train.data.chat_template.render_chat). A tokenizer without one (the byte and GPT-2 tokenizers, a Hugging Face
directory that ships none) gets the built-in ChatML template, ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
message and ``<|im_start|>assistant\\n`` as the generation prompt, encoded as ordinary text by a tokenizer that has no
such special tokens. The template decides how a turn ends (LLaMA-3's ``<|eot_id|>``, ChatML's ``<|im_end|>``);
nothing is appended to a conversation. A text sample is its text followed by the end-of-sequence token
(``eos_token_id``, else ``eot_token``).

Masking. The assistant turns' tokens are found by rendering prefixes of the conversation: for each assistant
message i, the prompt ``render(messages[:i], add_generation_prompt=True)`` must be a prefix of
``render(messages[:i+1])``, and the text between them is the answer (content plus the template's end-of-turn
marker, so the model learns to stop). The conversation is then tokenized segment by segment (prompt, answer,
prompt, answer, ..., the rest), the answers' tokens marked. A template that rewrites earlier turns breaks the
prefix rule and is an SFTDataError naming the file and line.

Why tokenizing segments is safe: a tokenizer splits its special tokens out of the text before the pre-tokenizer
and BPE run, so text on the two sides of a special token is tokenized independently either way. Where a template's
turn boundaries are special tokens (ChatML's ``<|im_start|>`` / ``<|im_end|>``, LLaMA-3's headers and
``<|eot_id|>``) the segments' tokens are exactly the whole text's tokens. Where a boundary falls inside ordinary
text (the newline after a header), the segments' tokens are what generation sees: there the prompt, generation
prompt included, is tokenized alone and the answer's tokens follow it. No token straddles a prompt and its answer.

Labels. ``labels[i]`` is ``input_ids[i]`` where the loss is trained and -1 elsewhere; this project's ignore index
is -1 (llm.c's, ``F.cross_entropy(..., ignore_index=-1)``), not Hugging Face's -100: replace -1 by -100 to compare
with transformers or TRL. Next-token targets are ``y[i] = labels[i + 1]``, -1 past the sample's end.
"""
from __future__ import annotations

import inspect
import os
from typing import NamedTuple

import numpy as np

from ..progress import progress
from .chat_template import render_chat
from .sft_records import Record, SFTDataError, check_format, read_records


class Sample(NamedTuple):
    input_ids: np.ndarray  # int64 (L,)
    labels: np.ndarray  # int64 (L,): input_ids where trained, -1 elsewhere


def uses_builtin_template(tokenizer):
    """True for a tokenizer rendered with the built-in ChatML template: one without apply_chat_template, or a Hugging
    Face tokenizer whose files carry no template (recorded in the SFT shards' meta.json)."""
    if not hasattr(tokenizer, "apply_chat_template"):
        return True
    return getattr(tokenizer, "chat_template", "") is None


def _encoder(tokenizer):
    """``text -> list of ids`` without special tokens added: Hugging Face-style tokenizers take
    add_special_tokens=False, the byte and GPT-2 tokenizers add none anyway."""
    try:
        params = inspect.signature(tokenizer.encode).parameters.values()
    except (TypeError, ValueError):
        params = ()
    if any(p.name == "add_special_tokens" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return lambda text: tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode


def eos_id(tokenizer):
    """The token that ends a text sample: eos_token_id when the tokenizer has one, else eot_token."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return int(tokenizer.eot_token if eos is None else eos)


def pad_id(tokenizer):
    """The id put on padding positions (their targets are -1, so only a valid embedding row matters)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    return eos_id(tokenizer) if pad is None else int(pad)


def _name(tokenizer):
    return getattr(tokenizer, "name", None) or type(tokenizer).__name__


def _render(tokenizer, messages, generation, path, line):
    try:
        return render_chat(tokenizer, messages, generation)
    except Exception as exc:  # a template's own error (jinja raise_exception, a missing variable, ...)
        what = f"the first {len(messages)} message(s)" + (" with the generation prompt" if generation else "")
        raise SFTDataError(
            f"{path}:{line}: the chat template of tokenizer {_name(tokenizer)!r} failed to render {what}: "
            f"{type(exc).__name__}: {exc}\nHINT: masking renders the conversation up to each assistant message, so "
            "the template must render such prefixes (one that wants a user message first cannot mask a conversation "
            "that opens with the assistant)", path, line) from None


def _prefix_error(tokenizer, path, line, i, prefix, text, what):
    cut = next((k for k, (a, b) in enumerate(zip(prefix, text)) if a != b), min(len(prefix), len(text)))
    near = slice(max(0, cut - 30), cut + 30)
    raise SFTDataError(
        f"{path}:{line}: the chat template of tokenizer {_name(tokenizer)!r} breaks the prefix rule at message {i}: "
        f"{what}; they differ at character {cut}: {prefix[near]!r} vs {text[near]!r}"
        "\nHINT: masking needs render(messages[:i], add_generation_prompt=True) to be a prefix of "
        "render(messages[:i+1]); templates that rewrite earlier turns (e.g. drop their reasoning) cannot be masked "
        "turn by turn: use a template that renders earlier turns unchanged", path, line)


def chat_segments(tokenizer, messages, path="<conversation>", line=1):
    """[(text, trained), ...] whose texts join to the rendered conversation; trained marks each assistant turn
    (see the module's docstring). Errors name ``path`` and ``line``, where the conversation came from."""
    segments, done = [], ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], True, path, line)
        full = _render(tokenizer, messages[:i + 1], False, path, line)
        if not prompt.startswith(done):
            _prefix_error(tokenizer, path, line, i, done, prompt, f"the conversation up to message {i} with the "
                                                             "generation prompt does not extend the text before it")
        if not full.startswith(prompt):
            _prefix_error(tokenizer, path, line, i, prompt, full, f"the prompt before assistant message {i} is not a "
                                                             "prefix of the conversation including it")
        segments += [(prompt[len(done):], False), (full[len(prompt):], True)]
        done = full
    whole = _render(tokenizer, messages, False, path, line)
    if not whole.startswith(done):
        _prefix_error(tokenizer, path, line, len(messages), done, whole, "the whole conversation does not extend the "
                                                                    "text up to its last assistant message")
    segments.append((whole[len(done):], False))
    return [(text, trained) for text, trained in segments if text]


def tokenize_record(tokenizer, record, encode=None):
    """(ids, mask) of a Record: uint32 token ids and a uint8 mask, 1 on the tokens the loss is trained on."""
    encode = encode or _encoder(tokenizer)
    if record.text is not None:
        ids = list(encode(record.text)) + [eos_id(tokenizer)]
        return np.asarray(ids, dtype=np.uint32), np.ones(len(ids), dtype=np.uint8)
    ids, mask = [], []
    for text, trained in chat_segments(tokenizer, record.messages, record.path, record.line):
        part = encode(text)
        ids += part
        mask += [trained] * len(part)
    return np.asarray(ids, dtype=np.uint32), np.asarray(mask, dtype=np.uint8)


def labels_of(ids, mask, train_on_prompt=False):
    """int64 labels: the ids where trained (everywhere with ``train_on_prompt``), -1 elsewhere."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids.copy() if train_on_prompt else np.where(np.asarray(mask, dtype=bool), ids, -1)


def make_sample(tokenizer, messages_or_text, train_on_prompt=False):
    """One Sample from a conversation (a list of {"role", "content"} dicts) or a text (a str)."""
    text = messages_or_text if isinstance(messages_or_text, str) else None
    record = Record("<sample>", 1, None if text is not None else list(messages_or_text), text)
    ids, mask = tokenize_record(tokenizer, record)
    return Sample(ids.astype(np.int64), labels_of(ids, mask, train_on_prompt))


class SampleTable:
    """Samples stored back to back: ``ids`` (uint32) and ``mask`` (uint8) of all tokens, ``offsets`` (int64,
    n + 1) where each sample starts. Built in memory from JSONL, or memory-mapped from an SFT shard."""

    def __init__(self, ids, mask, offsets, source):
        self.ids, self.mask, self.offsets, self.source = ids, mask, np.asarray(offsets, dtype=np.int64), source

    @classmethod
    def from_records(cls, records, tokenizer, source):
        encode = _encoder(tokenizer)
        ids, masks, offsets = [], [], [0]
        for record in progress(records, desc=f"tokenizing {os.path.basename(str(source))}", unit="sample"):
            i, m = tokenize_record(tokenizer, record, encode)
            ids.append(i)
            masks.append(m)
            offsets.append(offsets[-1] + len(i))
        if not ids:
            return cls(np.zeros(0, np.uint32), np.zeros(0, np.uint8), offsets, source)
        return cls(np.concatenate(ids), np.concatenate(masks), offsets, source)

    @classmethod
    def from_jsonl(cls, path, tokenizer, fmt):
        """Every record of the JSONL file, tokenized (``fmt``: text | chat | instruction)."""
        return cls.from_records(read_records(path, check_format(fmt)), tokenizer, path)

    def select(self, indices):
        """A table in memory of the samples ``indices``, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self.lengths[indices]
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        if not len(indices):
            return SampleTable(np.zeros(0, np.uint32), np.zeros(0, np.uint8), offsets, self.source)
        starts = self.offsets[indices]
        at = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])  # token indices in self
        return SampleTable(np.asarray(self.ids[at]), np.asarray(self.mask[at]), offsets, self.source)

    @classmethod
    def concatenate(cls, tables, source):
        """One table in memory of the samples of ``tables``, in order."""
        bases = np.cumsum([0] + [t.num_tokens for t in tables])
        offsets = [np.zeros(1, np.int64)] + [t.offsets[1:] + bases[k] for k, t in enumerate(tables)]
        return cls(np.concatenate([np.asarray(t.ids, np.uint32) for t in tables] or [np.zeros(0, np.uint32)]),
                   np.concatenate([np.asarray(t.mask, np.uint8) for t in tables] or [np.zeros(0, np.uint8)]),
                   np.concatenate(offsets), source)

    def __len__(self):
        return len(self.offsets) - 1

    @property
    def lengths(self):
        return np.diff(self.offsets)

    @property
    def num_tokens(self):
        return int(self.offsets[-1])

    def __getitem__(self, i):
        start, stop = self.offsets[i], self.offsets[i + 1]
        return self.ids[start:stop], self.mask[start:stop]

    def trained_within(self, limit, train_on_prompt=False, chunk_tokens=1 << 24):
        """Per sample: how many next-token targets its first ``limit`` tokens train, i.e. trained labels at its
        positions 1 .. min(L, limit) - 1. Reads the mask in chunks of about ``chunk_tokens`` tokens."""
        kept = np.minimum(self.lengths, limit)
        if train_on_prompt:
            return np.maximum(kept - 1, 0)
        counts = np.zeros(len(self), dtype=np.int64)
        first = 0
        while first < len(self):
            last = max(first + 1, int(np.searchsorted(self.offsets, self.offsets[first] + chunk_tokens, "right")) - 1)
            base = self.offsets[first]
            cumulative = np.concatenate([[0], np.cumsum(self.mask[base:self.offsets[last]], dtype=np.int64)])
            start, k = self.offsets[first:last] - base, kept[first:last]
            counts[first:last] = cumulative[start + k] - cumulative[start + np.minimum(k, 1)]
            first = last
        return counts

    def __repr__(self):
        return f"SampleTable({self.source!r}, samples={len(self)}, tokens={self.num_tokens})"
