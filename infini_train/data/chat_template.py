"""Chat templates: a model's Jinja template turned into the text it was trained on, rendered exactly as Hugging Face
transformers (5.x) renders it, so a conversation tokenizes here as it does there.

    text = render_chat_template(template, messages, add_generation_prompt=True,
                                special_tokens={"bos_token": "<s>", "eos_token": "</s>"})

The environment is transformers': Jinja2's ImmutableSandboxedEnvironment (templates from the Hub are untrusted
code) with trim_blocks, lstrip_blocks and the loopcontrols extension; globals ``raise_exception(message)`` (the
template refuses the conversation), ``strftime_now(format)``, a ``dict`` and a ``namespace`` that cannot reach
Python internals; a ``tojson`` filter that does not escape HTML (json.dumps(x, ensure_ascii=False, indent=None,
separators=None, sort_keys=False)); and the ``{% generation %}...{% endgeneration %}`` tag, which renders its body
and records where it lies (``generation_spans``: the assistant's text, for loss masks). The template sees
``messages``, ``tools``, ``documents`` (None unless given), ``add_generation_prompt``, the tokenizer's named special
tokens (``bos_token``, ``eos_token``, ...) and any extra keyword, which overrides a special token of the same name.
Messages are copied as plain JSON data first (keys whose value is None dropped, reasoning given under
``reasoning_content``, ``thinking`` or ``reasoning`` readable under all three), as transformers does.

CHATML_TEMPLATE is the template used for a tokenizer that ships none: ChatML, as Qwen and many fine-tunes use it,

    <|im_start|>{role}\\n{content}<|im_end|>\\n      for every message, then, with add_generation_prompt,
    <|im_start|>assistant\\n

No BOS or EOS is written; a tokenizer without ``<|im_start|>`` / ``<|im_end|>`` tokens encodes them as text.

Jinja2 is imported on first use; without it rendering raises ImportError saying what to install.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import Mapping
from datetime import datetime

import numpy as np

CHATML_TEMPLATE = ("{% for message in messages %}"
                   "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                   "{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHATML_SOURCE = "the built-in ChatML template (infini_train.data.chat_template.CHATML_TEMPLATE)"

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is the one templates read
MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes (transformers refuses them too)


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or that raised while rendering (its own message included)."""


class ChatMessageError(ValueError):
    """A conversation that is not a list of messages with a role and a content."""


def _jinja():
    try:
        import jinja2
    except ImportError:
        raise ImportError("chat templates need Jinja2, which is not installed\nHINT: pip install -e '.[tokenizers]' "
                          "(or pip install Jinja2==3.1.6)") from None
    version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if version < MIN_JINJA:
        raise ImportError(f"chat templates need Jinja2 >= 3.1.6 (older releases let a template escape its sandbox), "
                          f"got {jinja2.__version__}\nHINT: pip install -e '.[tokenizers]' (Jinja2==3.1.6)")
    return jinja2


class _SpanRecording(threading.local):
    state = None  # per thread: (blocks rendered so far, spans) while a render asks for the generation spans


@functools.lru_cache(maxsize=32)
def compile_chat_template(template, source="the chat template"):
    """``template`` compiled in the sandbox described above (cached); a syntax error is a ChatTemplateError naming
    ``source`` and the line."""
    jinja2 = _jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # {% generation %}body{% endgeneration %}: renders body; records its span while a render asks for spans
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            self.active = _SpanRecording()

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_span", []), [], [], body).set_lineno(lineno)

        def _span(self, caller):
            text = caller()
            state = self.active.state
            if state is not None:
                blocks, spans = state
                start = sum(len(b) for b in blocks)
                spans.append((start, start + len(text)))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters (<, >, &, '), which would change what the model sees
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class TemplateDict:
        # dict() and dict.fromkeys() without the class itself, so attribute access cannot reach type internals
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # a namespace that refuses underscore names, which lead to CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes "
                                                      f"on a namespace, got {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=TemplateDict(), namespace=TemplateNamespace)
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template ({source}) is not valid Jinja: line {exc.lineno}: {exc.message}\n"
                                "HINT: fix the template, or pass another with chat_template=") from None
    compiled.generation_tag = next(e for e in env.extensions.values() if isinstance(e, GenerationTag))
    return compiled


def plain_data(value):
    """``value`` rebuilt from plain JSON types (str, int, float, bool, None, dict, list, tuple) so the sandboxed
    template sees no object with methods of its own; anything else becomes a placeholder such as "<ndarray>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums, numpy strings) carry methods: back to the base type
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if isinstance(value, np.generic):
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def check_messages(messages):
    """``messages`` as the template will see them: each a dict with a str ``role`` and a ``content`` (an assistant
    message calling tools may leave content out), keys whose value is None dropped; else ChatMessageError."""
    if isinstance(messages, Mapping) or not isinstance(messages, (list, tuple)):
        raise ChatMessageError(f"chat messages: expected a list of {{'role': ..., 'content': ...}} dicts, got "
                               f"{type(messages).__name__}\nHINT: wrap a single message in a list")
    if not messages:
        raise ChatMessageError("chat messages: expected at least one message, got an empty list")
    checked = []
    for i, message in enumerate(messages):
        if dataclasses.is_dataclass(message) or callable(getattr(message, "model_dump", None)):
            message = plain_data(message)
        if not isinstance(message, Mapping):
            hint = ("one conversation at a time: call once per conversation" if isinstance(message, (list, tuple))
                    else "write each message as {'role': 'user', 'content': 'text'}")
            raise ChatMessageError(f"chat messages[{i}]: expected a dict with 'role' and 'content', got "
                                   f"{type(message).__name__} {str(message)[:80]!r}\nHINT: {hint}")
        message = {k: v for k, v in message.items() if v is not None}
        missing = [k for k in ("role", "content") if k not in message and not (k == "content" and "tool_calls" in
                                                                                  message)]
        if missing:
            raise ChatMessageError(f"chat messages[{i}]: expected keys 'role' and 'content', got a message without "
                                   f"{' and '.join(repr(k) for k in missing)} (keys {sorted(map(str, message))})\n"
                                   "HINT: every message needs a role ('system', 'user', 'assistant', ...) and its "
                                   "text under 'content' (a None value counts as missing)")
        if not isinstance(message["role"], str):
            raise ChatMessageError(f"chat messages[{i}]: expected the role as a str, got "
                                   f"{type(message['role']).__name__} {message['role']!r}")
        checked.append(message)
    return checked


def _alias_reasoning(message):
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def render_chat_template(template, messages, add_generation_prompt=False, tools=None, documents=None,
                         special_tokens=None, source="the chat template", generation_spans=None, **variables):
    """The text ``template`` (Jinja source) renders for ``messages`` -> str.

    ``tools``: JSON schemas (dicts) the template may describe; ``documents``: dicts for retrieval templates;
    ``special_tokens``: ``{"bos_token": "<s>", ...}`` as variables; ``variables``: more variables (they override a
    special token of the same name); ``source``: how errors name the template; ``generation_spans``: a list that
    receives the (start, end) character span of each ``{% generation %}`` block. A template that raises
    (``raise_exception``, an undefined value used, ...) is a ChatTemplateError with the template's own message."""
    jinja2 = _jinja()
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template ({source}): expected Jinja source as a str, got "
                                f"{type(template).__name__}")
    if tools is not None:
        for i, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                raise ChatTemplateError(f"tools[{i}]: expected a JSON schema (a dict with the function's name, "
                                        f"description and parameters), got {type(tool).__name__}\nHINT: write the "
                                        "schema out; functions are not converted here")
    if documents is not None and not all(isinstance(d, Mapping) for d in documents):
        raise ChatTemplateError("documents: expected a list of dicts with 'title' and 'text' keys")
    chat = [_alias_reasoning(m) for m in plain_data(check_messages(messages))]
    compiled = compile_chat_template(template, source)
    context = dict(plain_data({**(special_tokens or {}), **variables}), messages=chat, tools=plain_data(tools),
                   documents=plain_data(documents), add_generation_prompt=add_generation_prompt)
    tag, blocks, spans = compiled.generation_tag, [], []
    tag.active.state = (blocks, spans)
    try:
        for block in compiled.generate(**context):
            blocks.append(block)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template ({source}) raised: {exc.message or type(exc).__name__}\nHINT: the "
                                "template refuses these messages; check the roles and their order, or pass another "
                                "template with chat_template=") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template ({source}) failed: {type(exc).__name__}: {exc}\nHINT: the messages "
                                "may lack a field the template reads, or hold a value of another type") from exc
    finally:
        tag.active.state = None
    if generation_spans is not None:
        generation_spans.extend(spans)
    return "".join(blocks)


def render_chat(tokenizer, messages, add_generation_prompt=False):
    """A conversation as ``tokenizer`` expects it: its own template (an HFTokenizer's apply_chat_template), else
    CHATML_TEMPLATE (the byte and GPT-2 tokenizers, which ship none) -> str."""
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return render_chat_template(CHATML_TEMPLATE, messages, add_generation_prompt=add_generation_prompt,
                                source=CHATML_SOURCE)
