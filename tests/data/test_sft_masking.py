import json

import numpy as np
import pytest

from infini_train.data.sft import (
    SampleTable,
    chat_segments,
    eos_id,
    make_sample,
    pad_id,
    render_chat,
    uses_builtin_template,
)
from infini_train.data.sft_records import SFTDataError
from infini_train.data.tokenizer import ByteTokenizer
from tests.data.sft_tokenizers import HFStandIn


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "What is the capital of France?"), m("assistant", "Paris is the capital of France.")],
    [m("system", "You are a helpful assistant."), m("user", "Hello!"), m("assistant", "How can I help you today?"),
     m("user", "Write a short poem about the sea."), m("assistant", " The sea is wide and deep and blue. ")],
    [m("user", "1 + 1 = ?"), m("assistant", "2"), m("tool", "2 * 3 = 6"), m("assistant", "6"), m("user", "Thanks")],
    [m("system", "Answer briefly."), m("user", "Translate to French: good morning")],  # no assistant turn
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_labels_are_exactly_the_assistant_tokens_of_the_transformers_template(hf_tokenizer, llama_tok, index):
    messages = CONVERSATIONS[index]
    sample = make_sample(llama_tok, messages)
    # the oracle: transformers renders and tokenizes the whole conversation and marks the {% generation %} spans
    ref = hf_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                           return_assistant_tokens_mask=True)
    np.testing.assert_array_equal(sample.input_ids, ref["input_ids"])  # segment by segment = the whole text
    np.testing.assert_array_equal(sample.labels >= 0, np.asarray(ref["assistant_masks"], dtype=bool))
    trained = sample.labels >= 0
    np.testing.assert_array_equal(sample.labels[trained], sample.input_ids[trained])
    assert (sample.labels[~trained] == -1).all()  # the project's ignore index: -1 where HF writes -100
    hf_labels = np.where(np.asarray(ref["assistant_masks"], dtype=bool), ref["input_ids"], -100)
    np.testing.assert_array_equal(np.where(sample.labels == -1, -100, sample.labels), hf_labels)
    answers = [x["content"].strip() + "<|eot_id|>" for x in messages if x["role"] == "assistant"]
    assert hf_tokenizer.decode(sample.input_ids[trained].tolist()) == "".join(answers)
    assert sample.input_ids.dtype == sample.labels.dtype == np.int64


def test_train_on_prompt_trains_every_token(llama_tok):
    sample = make_sample(llama_tok, CONVERSATIONS[1], train_on_prompt=True)
    np.testing.assert_array_equal(sample.labels, sample.input_ids)


def test_byte_tokenizer_gets_the_builtin_chatml_rendering():
    tok = ByteTokenizer()
    assert uses_builtin_template(tok)
    messages = [m("system", "S"), m("user", "hi"), m("assistant", "yo"), m("user", "ok?"), m("assistant", "ok")]
    text = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
            "<|im_start|>user\nok?<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n")
    assert render_chat(tok, messages) == text
    assert render_chat(tok, messages[:2], add_generation_prompt=True).endswith("hi<|im_end|>\n<|im_start|>assistant\n")
    sample = make_sample(tok, messages)
    assert bytes(sample.input_ids.tolist()) == text.encode()
    trained = "".join("1" if label >= 0 else "0" for label in sample.labels)
    first = text.index("yo<|im_end|>")
    second = text.rindex("ok<|im_end|>")
    expected = ["0"] * len(text)
    for start, answer in ((first, "yo<|im_end|>\n"), (second, "ok<|im_end|>\n")):
        expected[start:start + len(answer)] = "1" * len(answer)
    assert trained == "".join(expected)


def test_text_samples_train_every_token_and_end_with_eos(llama_tok):
    tok = ByteTokenizer()
    sample = make_sample(tok, "héllo")
    assert sample.input_ids.tolist() == list("héllo".encode()) + [256] and (sample.labels == sample.input_ids).all()
    sample = make_sample(llama_tok, "The sea is blue.")
    assert sample.input_ids.tolist() == llama_tok.encode("The sea is blue.") + [llama_tok.eos_token_id]
    assert eos_id(tok) == pad_id(tok) == 256
    assert llama_tok.pad_token_id is None and pad_id(llama_tok) == eos_id(llama_tok) == llama_tok.eos_token_id


class CountingTemplate(HFStandIn):
    """A template that starts with the number of messages: rendering a prefix changes the text before it."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        body = "".join(f"[{x['role']}] {x['content']}\n" for x in messages)
        return f"{len(messages)} turns\n{body}" + ("[assistant] " if add_generation_prompt else "")


def test_a_template_that_breaks_the_prefix_rule_is_an_error_naming_file_and_line(tmp_path, hf_tokenizer):
    path = tmp_path / "chat.jsonl"
    path.write_text("\n" + json.dumps({"messages": CONVERSATIONS[0]}) + "\n")
    tok = CountingTemplate(hf_tokenizer)
    with pytest.raises(SFTDataError) as info:
        SampleTable.from_jsonl(str(path), tok, "chat")
    # "1 turns" before the answer, "2 turns" once it is there
    assert str(info.value).startswith(f"{path}:2: the chat template of tokenizer 'tiny-llama3' breaks the prefix rule "
                                      "at message 1: the prompt before assistant message 1 is not a prefix of the "
                                      "conversation including it; they differ at character 0: '1 turns")
    assert "HINT: masking needs render(messages[:i], add_generation_prompt=True) to be a prefix" in str(info.value)
    assert (info.value.path, info.value.line) == (str(path), 2)


def test_a_template_failing_on_a_prefix_is_an_error_naming_file_and_line(hf_tokenizer):
    class Strict(HFStandIn):
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            if not messages:
                raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
            return super().apply_chat_template(messages, tokenize, add_generation_prompt)

    with pytest.raises(SFTDataError, match=r"^x.jsonl:7: the chat template of tokenizer 'tiny-llama3' failed to "
                                           r"render the first 0 message\(s\) with the generation prompt: ValueError: "
                                           r"Conversation roles must alternate"):
        chat_segments(Strict(hf_tokenizer), [m("assistant", "hi"), m("user", "hello")], "x.jsonl", 7)


def test_segments_join_to_the_rendered_conversation(llama_tok):
    for messages in CONVERSATIONS:
        segments = chat_segments(llama_tok, messages)
        assert "".join(text for text, _ in segments) == render_chat(llama_tok, messages)
        assert [text for text, trained in segments if trained] == [
            x["content"].strip() + "<|eot_id|>" for x in messages if x["role"] == "assistant"]


def test_a_hf_tokenizer_whose_files_carry_no_template_gets_chatml(hf_dirs):
    from infini_train.data.tokenizer import get_tokenizer

    tok = get_tokenizer("hf:" + hf_dirs["plain"])  # a directory without a chat template
    assert uses_builtin_template(tok) and not uses_builtin_template(get_tokenizer("hf:" + hf_dirs["llama3"]))
    text = render_chat(tok, CONVERSATIONS[0])
    assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis is the " \
                   "capital of France.<|im_end|>\n"
    sample = make_sample(tok, CONVERSATIONS[0])
    assert tok.decode(sample.input_ids[sample.labels >= 0]) == "Paris is the capital of France.<|im_end|>\n"
