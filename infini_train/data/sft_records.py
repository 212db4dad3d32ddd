"""SFT records: JSONL files read line by line into conversations or texts; every problem is one SFTDataError
naming the file and line, what was expected, what was found and a HINT.

The formats (``data.format``; ``tokens`` is llm.c's pre-tokenised shards and never comes here):

    text         {"text": "..."}                                            a text, trained on every token
    chat         {"messages": [{"role": "user", "content": "..."}, ...]}    roles system | user | assistant | tool
    instruction  {"prompt": "...", "completion": "..."}                      -> user: prompt, assistant: completion
                 {"instruction": "...", "input": "...", "output": "..."}     (Alpaca) -> user: instruction, then
                                                                             "\\n\\n" and input when input is not
                                                                             empty; assistant: output

    for record in read_records("data/chat.jsonl", "chat"):
        record.path, record.line, record.messages   # a list of {"role", "content", ...} dicts (text: record.text)

Blank lines are allowed and skipped; a file with no record at all is an error. A message's keys other than role
and content (name, tool_call_id, ...) are passed on to the chat template as they are.
"""
from __future__ import annotations

import codecs
import difflib
import json
from typing import NamedTuple, Optional

SFT_FORMATS = ("text", "chat", "instruction")
ROLES = ("system", "user", "assistant", "tool")
# ShareGPT's and other datasets' names for the roles: named in the hint when a role is unknown
FOREIGN_ROLES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                 "function": "tool", "ipython": "tool"}


class SFTDataError(ValueError):
    """Bad SFT data: ``path`` and ``line`` (1-based; None for a whole-file problem) say where."""

    def __init__(self, message, path=None, line=None):
        super().__init__(message)
        self.path, self.line = path, line


class Record(NamedTuple):
    path: str
    line: int
    messages: Optional[list] = None  # chat and instruction
    text: Optional[str] = None  # text


def _describe(value):
    """A JSON value as its JSON kind and a short repr: 'a list [1, 2]', 'null'."""
    if value is None:
        return "null"
    kind = {dict: "an object", list: "a list", bool: "a boolean", str: "a string"}.get(type(value), "a number")
    shown = repr(value)
    return f"{kind} {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _fail(path, line, message, hint):
    raise SFTDataError(f"{path}:{line}: {message}\nHINT: {hint}", path, line)


def _format_of_keys(obj):
    """The format whose fields the object has, or None."""
    if "messages" in obj:
        return "chat"
    if "prompt" in obj or "instruction" in obj or "completion" in obj or "output" in obj:
        return "instruction"
    if "text" in obj:
        return "text"
    return None


def guess_format(path):
    """The format whose fields the first record of the JSONL file ``path`` has (chat | instruction | text), or None."""
    for _, obj in iter_jsonl(path):
        return _format_of_keys(obj)


def _missing_field(path, line, obj, fmt, fields):
    other = _format_of_keys(obj)
    keys = ", ".join(map(repr, list(obj)[:8])) or "none"
    hint = (f"this record looks like data.format={other} (set data.format: {other}, or --format {other})"
            if other and other != fmt else f"each line of a {fmt} file needs {fields}")
    _fail(path, line, f"expected the field {fields} of data.format={fmt}, got an object with the keys {keys}", hint)


def _string(path, line, obj, key, where=None):
    value = obj[key]
    name = where or repr(key)
    if not isinstance(value, str):
        _fail(path, line, f"expected {name} to be a string, got {_describe(value)}",
              "write the value as a JSON string (lists of content parts are not supported: join their text)")
    return value


def iter_jsonl(path):
    """(line number, object) for every non-blank line of ``path`` (a UTF-8 byte-order mark at its start is skipped);
    an SFTDataError for invalid UTF-8, invalid JSON, a line that is not a JSON object, or a file with no line at
    all."""
    count = 0
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise SFTDataError(f"{path}: cannot read the SFT data ({exc.strerror or exc})\nHINT: check data.train / "
                           "data.val (a .jsonl file or a glob of them)", path) from None
    with f:
        for number, raw in enumerate(f, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):  # a UTF-8 BOM, as Windows editors write it
                raw = raw[len(codecs.BOM_UTF8):]
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8").rstrip("\r\n")  # a column of an error then stays on this line
            except UnicodeDecodeError as exc:
                _fail(path, number, f"expected UTF-8 text, got the bytes {raw[exc.start:exc.start + 4]!r} at column "
                                    f"{exc.start + 1} ({exc.reason})", "JSONL is UTF-8: re-encode the file "
                                                                       "(e.g. iconv -f latin1 -t utf-8)")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                _fail(path, number, f"invalid JSON: {exc.msg} at column {exc.colno}",
                      "JSONL holds one JSON object per line; a record must not span lines")
            if not isinstance(obj, dict):
                _fail(path, number, f"expected a JSON object per line, got {_describe(obj)}",
                      'write each record as an object, e.g. {"messages": [...]} or {"text": "..."}')
            count += 1
            yield number, obj
    if count == 0:
        raise SFTDataError(f"{path}: expected JSON lines (one object per line), got an empty file\nHINT: point "
                           "data.train / data.val at a file with samples", path)


def _message(path, line, k, message):
    where = f"messages[{k}]"
    if not isinstance(message, dict):
        _fail(path, line, f"expected {where} to be an object with \"role\" and \"content\", got {_describe(message)}",
              'write each message as {"role": "user", "content": "..."}')
    if "role" not in message:
        sharegpt = "from" in message and "value" in message
        _fail(path, line, f"expected {where} to have a \"role\", got the keys {', '.join(map(repr, message))}",
              "ShareGPT's {\"from\", \"value\"} messages: convert them to {\"role\", \"content\"} (human -> user, "
              "gpt -> assistant)" if sharegpt else f"give every message one of the roles {', '.join(ROLES)}")
    role = message["role"]
    if not isinstance(role, str):
        _fail(path, line, f"expected {where}.role to be a string, got {_describe(role)}",
              f"one of {', '.join(ROLES)}")
    if role not in ROLES:
        close = difflib.get_close_matches(role, ROLES, n=1, cutoff=0.6)
        hint = (f"did you mean {close[0]!r}?" if close else f"{role!r} is called {FOREIGN_ROLES[role]!r} here"
                if role in FOREIGN_ROLES else "rename the role")
        _fail(path, line, f"expected {where}.role to be one of {', '.join(ROLES)}, got {role!r}", hint)
    if message.get("content") is None:
        _fail(path, line, f"expected {where} ({role}) to have a \"content\" string, got "
                          f"{'null' if 'content' in message else 'no content'}",
              "every message needs its text; tool calls without text are not supported")
    _string(path, line, message, "content", f"{where}.content")
    return dict(message)


def _chat(path, line, obj):
    if "messages" not in obj:
        _missing_field(path, line, obj, "chat", '"messages"')
    messages = obj["messages"]
    if not isinstance(messages, list):
        _fail(path, line, f"expected \"messages\" to be a list of messages, got {_describe(messages)}",
              'write "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]')
    if not messages:
        _fail(path, line, "expected at least one message, got \"messages\": []", "leave the record out")
    return [_message(path, line, k, m) for k, m in enumerate(messages)]


def instruction_messages(path, line, obj):
    """An instruction record as [user, assistant] messages (see the module's docstring)."""
    if "prompt" in obj or "completion" in obj:
        for key in ("prompt", "completion"):
            if key not in obj:
                _missing_field(path, line, obj, "instruction", '"prompt" and "completion"')
        user, answer = _string(path, line, obj, "prompt"), _string(path, line, obj, "completion")
    elif "instruction" in obj or "output" in obj:
        for key in ("instruction", "output"):
            if key not in obj:
                _missing_field(path, line, obj, "instruction", '"instruction" and "output" (Alpaca)')
        user, answer = _string(path, line, obj, "instruction"), _string(path, line, obj, "output")
        extra = "" if obj.get("input") is None else _string(path, line, obj, "input")
        if extra:
            user = f"{user}\n\n{extra}"
    else:
        _missing_field(path, line, obj, "instruction", '"prompt" and "completion" (or Alpaca\'s "instruction", '
                                                       '"input" and "output")')
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def check_format(fmt, where="data.format"):
    if fmt not in SFT_FORMATS:
        close = difflib.get_close_matches(str(fmt), SFT_FORMATS + ("tokens",), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close and close[0] != "tokens" else ""
        raise ValueError(f"{where}: expected one of {', '.join(SFT_FORMATS)} for JSONL data, got {fmt!r}\nHINT: "
                         f"{hint}tokens (pre-tokenised .bin shards) is read by DistributedDataLoader")
    return fmt


def read_records(path, fmt):
    """Every record of the JSONL file ``path`` in data.format ``fmt``, in file order, as Records."""
    check_format(fmt)
    for line, obj in iter_jsonl(path):
        if fmt == "text":
            if "text" not in obj:
                _missing_field(path, line, obj, "text", '"text"')
            yield Record(path, line, text=_string(path, line, obj, "text"))
        elif fmt == "chat":
            yield Record(path, line, messages=_chat(path, line, obj))
        else:
            yield Record(path, line, messages=instruction_messages(path, line, obj))
