import json
import re

import pytest

from infini_train.data.sft_loader import SFTDataLoader
from infini_train.data.sft_records import SFTDataError, read_records
from infini_train.data.tokenizer import ByteTokenizer

USER, ASSISTANT = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
GOOD_CHAT = json.dumps({"messages": [USER, ASSISTANT]})


def write(tmp_path, lines, name="data.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return str(path)


def test_chat_records_keep_messages_and_skip_blank_lines(tmp_path):
    tool = {"role": "tool", "content": "42", "name": "calc"}
    path = write(tmp_path, [GOOD_CHAT, "", "   ", json.dumps({"messages": [USER, ASSISTANT, tool]})])
    records = list(read_records(path, "chat"))
    assert [r.line for r in records] == [1, 4] and all(r.path == path for r in records)
    assert records[0].messages == [USER, ASSISTANT] and records[0].text is None
    assert records[1].messages[2] == tool  # other keys reach the template as they are


def test_instruction_records_become_a_user_and_an_assistant_turn(tmp_path):
    path = write(tmp_path, [json.dumps({"prompt": "2+2?", "completion": "4"}),
                            json.dumps({"instruction": "Translate", "input": "good morning", "output": "bonjour"}),
                            json.dumps({"instruction": "Say hi", "input": "", "output": "hi"}),
                            json.dumps({"instruction": "Say hi", "output": "hi"})])
    got = [r.messages for r in read_records(path, "instruction")]
    assert got[0] == [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    assert got[1] == [{"role": "user", "content": "Translate\n\ngood morning"},
                      {"role": "assistant", "content": "bonjour"}]
    assert got[2] == got[3] == [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}]


def test_text_records(tmp_path):
    path = write(tmp_path, [json.dumps({"text": "one"}), json.dumps({"text": "two", "id": 3})])
    assert [(r.line, r.text) for r in read_records(path, "text")] == [(1, "one"), (2, "two")]


def error_of(path, fmt):
    with pytest.raises(SFTDataError) as info:
        list(read_records(path, fmt))
    return info.value


@pytest.mark.parametrize("line, fmt, expected", [
    ('{"messages": [', "chat", r"invalid JSON: Expecting value at column 15\nHINT: JSONL holds one JSON object per "
                               r"line"),
    ('[1, 2]', "chat", r"expected a JSON object per line, got a list \[1, 2\]"),
    ('{"text": "x"}', "chat", r"expected the field \"messages\" of data.format=chat, got an object with the keys 'text'"
                              r"\nHINT: this record looks like data.format=text"),
    ('{"prompt": "a", "completion": "b"}', "chat", r"looks like data.format=instruction"),
    ('{"messages": "hi"}', "chat", r"expected \"messages\" to be a list of messages, got a string 'hi'"),
    ('{"messages": []}', "chat", r"expected at least one message, got \"messages\": \[\]"),
    ('{"messages": ["hi"]}', "chat", r"expected messages\[0\] to be an object with \"role\" and \"content\", got a "
                                     r"string 'hi'"),
    ('{"messages": [{"content": "x"}]}', "chat", r"expected messages\[0\] to have a \"role\", got the keys 'content'"),
    ('{"messages": [{"from": "human", "value": "x"}]}', "chat", r"HINT: ShareGPT's"),
    ('{"messages": [{"role": "asistant", "content": "x"}]}', "chat",
     r"expected messages\[0\].role to be one of system, user, assistant, tool, got 'asistant'\nHINT: did you mean "
     r"'assistant'\?"),
    ('{"messages": [{"role": "gpt", "content": "x"}]}', "chat", r"HINT: 'gpt' is called 'assistant' here"),
    ('{"messages": [{"role": 3, "content": "x"}]}', "chat",
     r"expected messages\[0\].role to be a string, got a number 3"),
    ('{"messages": [{"role": "user"}]}', "chat", r"expected messages\[0\] \(user\) to have a \"content\" string, got "
                                                 r"no content"),
    ('{"messages": [{"role": "user", "content": null}]}', "chat", r"\(user\) to have a \"content\" string, got null"),
    ('{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', "chat",
     r"expected messages\[0\].content to be a string, got a list \[\{'type': 'text'\}\]"),
    ('{"prompt": "a"}', "instruction", r"expected the field \"prompt\" and \"completion\" of data.format=instruction"),
    ('{"instruction": "a", "input": "b"}', "instruction", r"\"instruction\" and \"output\" \(Alpaca\)"),
    ('{"question": "a"}', "instruction", r"expected the field \"prompt\" and \"completion\" \(or Alpaca's"),
    ('{"prompt": 1, "completion": "b"}', "instruction", r"expected 'prompt' to be a string, got a number 1"),
    ('{"instruction": "a", "input": 5, "output": "b"}', "instruction", r"expected 'input' to be a string"),
    ('{"body": "x"}', "text", r"expected the field \"text\" of data.format=text, got an object with the keys 'body'"),
    ('{"text": true}', "text", r"expected 'text' to be a string, got a boolean True"),
])
def test_each_bad_record_is_one_error_naming_file_and_line(tmp_path, line, fmt, expected):
    path = write(tmp_path, [GOOD_CHAT if fmt == "chat" else '{"text": "ok", "prompt": "p", "completion": "c"}',
                            "", line])
    err = error_of(path, fmt)
    assert (err.path, err.line) == (path, 3)
    assert str(err).startswith(f"{path}:3: ")
    assert "HINT: " in str(err)
    assert re.search(expected, str(err)), str(err)


def test_invalid_utf8_and_empty_files(tmp_path):
    path = write(tmp_path, ['{"text": "ok"}', b'{"text": "caf\xe9"}'])
    err = error_of(path, "text")
    assert str(err).startswith(f"{path}:2: expected UTF-8 text, got the bytes") and err.line == 2
    empty = write(tmp_path, [], "empty.jsonl")
    err = error_of(empty, "chat")
    assert str(err).startswith(f"{empty}: expected JSON lines (one object per line), got an empty file")
    blank = write(tmp_path, ["", "  "], "blank.jsonl")
    assert "got an empty file" in str(error_of(blank, "chat"))
    with pytest.raises(SFTDataError, match=r"cannot read the SFT data"):
        list(read_records(str(tmp_path / "missing.jsonl"), "chat"))


def test_unknown_format_suggests_one(tmp_path):
    with pytest.raises(ValueError, match=r"data.format: expected one of text, chat, instruction for JSONL data, got "
                                         r"'chatt'\nHINT: did you mean 'chat'\?"):
        list(read_records(write(tmp_path, [GOOD_CHAT]), "chatt"))
    with pytest.raises(ValueError, match="tokens \\(pre-tokenised .bin shards\\) is read by DistributedDataLoader"):
        list(read_records(write(tmp_path, [GOOD_CHAT]), "tokens"))


def test_the_loader_reports_the_bad_line_of_the_right_file(tmp_path):
    write(tmp_path, [GOOD_CHAT, GOOD_CHAT], "a.jsonl")
    bad = write(tmp_path, [GOOD_CHAT, GOOD_CHAT, GOOD_CHAT, '{"messages": [{"role": "user", "content": 7}]}'],
                "b.jsonl")
    with pytest.raises(SFTDataError) as info:
        SFTDataLoader(str(tmp_path / "*.jsonl"), ByteTokenizer(), 1, 64, format="chat")
    assert str(info.value).startswith(f"{bad}:4: expected messages[0].content to be a string")


def test_a_utf8_byte_order_mark_at_the_start_is_skipped(tmp_path):
    plain = list(read_records(write(tmp_path, [GOOD_CHAT, GOOD_CHAT]), "chat"))
    bom = write(tmp_path, [b"\xef\xbb\xbf" + GOOD_CHAT.encode(), GOOD_CHAT], "bom.jsonl")
    assert [(r.line, r.messages) for r in read_records(bom, "chat")] == [(r.line, r.messages) for r in plain]
    alone = write(tmp_path, [b"\xef\xbb\xbf", GOOD_CHAT], "bom_line.jsonl")  # a BOM on a line of its own
    assert [r.line for r in read_records(alone, "chat")] == [2]
    later = write(tmp_path, [GOOD_CHAT, b"\xef\xbb\xbf" + GOOD_CHAT.encode()], "bom_later.jsonl")
    assert str(error_of(later, "chat")).startswith(f"{later}:2: invalid JSON: Unexpected UTF-8 BOM")
