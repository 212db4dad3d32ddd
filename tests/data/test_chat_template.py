"""Chat templates rendered byte for byte as transformers' apply_chat_template renders them (tests/data/hf_dirs.py's
tokenizers), the built-in ChatML template, and the errors."""
import datetime
import os

import pytest

from infini_train.data.chat_template import (CHATML_TEMPLATE, ChatMessageError, ChatTemplateError,
                                             render_chat_template)
from infini_train.data.tokenizer import get_tokenizer

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "user", "content": "  2+2?  "}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And héllo 🙂 with <|eot_id|> and </s> in the text?"}],
    [{"role": "system", "content": "Be terse.\nAlways."}, {"role": "user", "content": "Name a color."},
     {"role": "assistant", "content": "Blue.", "reasoning_content": "pick one"}, {"role": "user", "content": "More"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "q", "name": None}],  # None values dropped
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & 'here'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def pairs(hf_dirs):
    return {name: (get_tokenizer("hf:" + path), transformers.PreTrainedTokenizerFast.from_pretrained(path))
            for name, path in hf_dirs.items()}


@pytest.mark.parametrize("name", ["llama3", "qwen", "strict"])
def test_templates_render_as_transformers(pairs, name):
    ours, ref = pairs[name]
    for messages in CONVERSATIONS:
        for generation_prompt in (False, True):
            for tools in (None, TOOLS):
                kwargs = dict(add_generation_prompt=generation_prompt, tools=tools)
                text = ref.apply_chat_template(messages, tokenize=False, **kwargs)
                assert ours.apply_chat_template(messages, tokenize=False, **kwargs) == text
                ids = ref.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
                assert ours.apply_chat_template(messages, **kwargs) == ids  # tokenize=True by default
                assert ids == ours.encode(text, add_special_tokens=False)


def test_what_the_templates_write(pairs):
    llama, qwen, strict = (pairs[n][0] for n in ("llama3", "qwen", "strict"))
    messages = CONVERSATIONS[2]
    assert llama.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.\nAlways.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nName a color.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = llama.apply_chat_template(messages[:2])
    assert ids[0] == llama.bos_token_id and ids.count(llama.bos_token_id) == 1  # the template's BOS only
    assert ids.count(llama.token_to_id("<|eot_id|>")) == 2
    assert qwen.apply_chat_template(messages[1:3], tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\npick one\n</think>\n\nBlue.<|im_end|>\n")
    assert "<think>" not in qwen.apply_chat_template(messages[1:3], tokenize=False, enable_thinking=False)
    assert qwen.apply_chat_template(messages[:1] + messages[1:2], tokenize=False, tools=TOOLS).startswith(
        '<|im_start|>system\nBe terse.\nAlways.\n\n# Tools\n\n<tools>\n{"type": "function", "function": {"name": '
        '"get_weather", "description": "Weather <now> & \'here\'"')  # tojson keeps <, & and ' as they are
    assert strict.apply_chat_template(messages, tokenize=False).endswith("<!-- 2 turns, 4 messages -->\n")
    assert strict.apply_chat_template(messages, tokenize=False, tools=TOOLS).startswith(
        '<s>[AVAILABLE_TOOLS][\n  {\n    "type": "function"')  # the named tool_use template, with tools


def test_built_in_chatml_template_for_a_tokenizer_without_one(pairs):
    for name in ("plain", "bert"):
        ours, ref = pairs[name]
        assert ours.chat_template is None
        for messages in CONVERSATIONS:
            for generation_prompt in (False, True):
                text = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                               chat_template=CHATML_TEMPLATE)
                assert ours.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=generation_prompt) == text
                assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == \
                    ref.apply_chat_template(messages, add_generation_prompt=generation_prompt, return_dict=False,
                                            chat_template=CHATML_TEMPLATE)
    plain = pairs["plain"][0]
    assert plain.apply_chat_template(CONVERSATIONS[2][:2], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe terse.\nAlways.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
        "<|im_start|>assistant\n")
    ids = plain.apply_chat_template(CONVERSATIONS[0])
    assert ids[0] == plain.token_to_id("<|im_start|>") and ids[-2:] == [plain.token_to_id("<|im_end|>"),
                                                                       plain.encode("\n")[0]]


def test_chat_template_argument_and_template_names(pairs, hf_dirs):
    ours, ref = pairs["strict"]
    messages = CONVERSATIONS[1]
    assert ours.apply_chat_template(messages, tokenize=False, chat_template="tool_use") == \
        ref.apply_chat_template(messages, tokenize=False, chat_template="tool_use")
    source = "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ eos_token }}"
    assert ours.apply_chat_template(messages, tokenize=False, chat_template=source) == \
        ref.apply_chat_template(messages, tokenize=False, chat_template=source)
    assert set(ours.chat_template) == {"default", "tool_use"}
    template, where = ours.get_chat_template()
    assert where == os.path.join(hf_dirs["strict"], "chat_template.jinja") and template == ours.chat_template["default"]
    assert pairs["qwen"][0].get_chat_template()[1] == os.path.join(hf_dirs["qwen"], "tokenizer_config.json") + \
        ": chat_template"


def test_variables_special_tokens_and_jinja_extras():
    messages = [{"role": "user", "content": "x"}]
    template = ("{{ bos_token }}|{{ custom }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}"
                "|{{ {'a': '<&>'} | tojson }}|{{ strftime_now('%Y') }}|{% for i in range(5) %}{% if i == 1 %}"
                "{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}|{{ dict(a=1) }}")
    rendered = render_chat_template(template, messages, special_tokens={"bos_token": "<s>", "eos_token": "</s>"},
                                    custom="c")
    year = datetime.datetime.now().year
    assert rendered in (f'<s>|c|True|True|False|{{"a": "<&>"}}|{y}|02|{{\'a\': 1}}' for y in (year, year + 1))
    # keywords override special tokens, as in transformers
    assert render_chat_template("{{ bos_token }}", messages, special_tokens={"bos_token": "<s>"}, bos_token="B") == "B"
    ref = transformers.utils.chat_template_utils.render_jinja_template
    template = "{%- for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}  tail"
    assert render_chat_template(template, messages) == ref([messages], chat_template=template)[0][0]


def test_generation_spans_match_transformers_assistant_indices(pairs):
    ours = pairs["strict"][0]
    messages = CONVERSATIONS[1][:2] + [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    template = ours.get_chat_template()[0]
    spans = []
    text = render_chat_template(template, messages, special_tokens=ours.special_tokens, generation_spans=spans)
    ref_text, ref_spans = transformers.utils.chat_template_utils.render_jinja_template(
        [messages], chat_template=template, return_assistant_tokens_mask=True, **ours.special_tokens)
    assert (text, spans) == (ref_text[0], ref_spans[0]) and [text[a:b] for a, b in spans] == [" 4 </s>", " y </s>"]


def test_a_template_that_raises_names_itself_and_its_message(pairs, hf_dirs):
    ours, ref = pairs["strict"]
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        ref.apply_chat_template(messages, tokenize=False)
    where = os.path.join(hf_dirs["strict"], "chat_template.jinja")
    with pytest.raises(ChatTemplateError, match=rf"^chat template \({where}\) raised: Conversation roles must "
                                                r"alternate user/assistant/user/assistant/...\nHINT: the template "
                                                r"refuses these messages"):
        ours.apply_chat_template(messages)
    with pytest.raises(ChatTemplateError, match=r"^chat template \(the chat_template argument\) raised: 'dict "
                                                r"object' has no attribute 'text'"):
        ours.apply_chat_template(messages, chat_template="{{ messages[0].text + 'x' }}")
    with pytest.raises(ChatTemplateError, match=r"^chat template \(the chat_template argument\) is not valid Jinja: "
                                                r"line 2: .*'endfor'"):
        ours.apply_chat_template(messages, chat_template="{% for m in messages %}\n{{ m }}")
    with pytest.raises(ChatTemplateError, match=r"raised: chat templates cannot store underscore-prefixed "
                                                r"attributes on a namespace, got '__class__'"):
        render_chat_template("{% set ns = namespace() %}{% set ns.__class__ = 1 %}", messages)
    with pytest.raises(ChatTemplateError, match=r"raised: .*unsafe"):  # the sandbox
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}", messages)


def test_messages_without_role_or_content_are_refused(pairs):
    tok = pairs["qwen"][0]
    cases = [
        ([{"content": "x"}], r"chat messages\[0\]: expected keys 'role' and 'content', got a message without 'role' "
                             r"\(keys \['content'\]\)\nHINT: every message needs a role"),
        ([{"role": "user", "content": "x"}, {"role": "assistant"}],
         r"chat messages\[1\]: expected keys 'role' and 'content', got a message without 'content' "
         r"\(keys \['role'\]\)"),
        ([{"role": "user", "content": None}], r"chat messages\[0\]: .* without 'content'"),
        ([{"role": 1, "content": "x"}], r"chat messages\[0\]: expected the role as a str, got int 1"),
        ([], r"chat messages: expected at least one message, got an empty list"),
        ({"role": "user", "content": "x"}, r"chat messages: expected a list .*got dict\nHINT: wrap a single message"),
        ([[{"role": "user", "content": "x"}]], r"chat messages\[0\]: expected a dict .*got list.*\nHINT: one "
                                               r"conversation at a time"),
        (["hello"], r"chat messages\[0\]: expected a dict with 'role' and 'content', got str 'hello'"),
    ]
    for messages, pattern in cases:
        with pytest.raises(ChatMessageError, match=pattern):
            tok.apply_chat_template(messages)
    # an assistant message that calls tools needs no content
    calls = [{"role": "user", "content": "w?"}, {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}]
    assert render_chat_template("{{ messages[1].tool_calls[0].function.name }}", calls) == "get_weather"
    with pytest.raises(TypeError, match=r"does not take continue_final_message, return_dict \(transformers' "
                                        r"options\)\nHINT: it returns the ids"):
        tok.apply_chat_template(calls[:1], continue_final_message=True, return_dict=False)
    def get_weather(city: str):
        """The weather in a city."""

    with pytest.raises(ChatTemplateError, match=r"tools\[0\]: expected a JSON schema .*got function\nHINT: write the "
                                                r"schema out"):
        tok.apply_chat_template(calls[:1], tools=[get_weather])
