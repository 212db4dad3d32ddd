"""generate.py --chat with a Hugging Face tokenizer: what is streamed and kept of a reply (a stand-in model replays
scripted tokens, so the test is about the chat loop, not about a model)."""
import importlib.util
import io
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(REPO, "examples", "gpt2")


@pytest.fixture(scope="module")
def generate_script():
    sys.path.insert(0, SCRIPTS)  # (generate.py imports its sibling common.py)
    try:
        spec = importlib.util.spec_from_file_location("generate_under_test", os.path.join(SCRIPTS, "generate.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(SCRIPTS)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    from tests.data.hf_dirs import build_all

    return build_all(str(tmp_path_factory.mktemp("hf_tokenizers")))


class ScriptedModel:
    """Replays ``reply`` ids as generate() would produce them (streamed one by one, ending at a stop token), and
    keeps each prompt it was given."""

    config = SimpleNamespace(context_length=512)

    def __init__(self, reply):
        self.reply, self.prompts = reply, []

    def generate(self, idx, max_new_tokens, stream=None, stop_tokens=(), **sampling):
        prompt = idx.numpy()[0].tolist()
        self.prompts.append(prompt)
        produced = []
        for token in self.reply[:max_new_tokens]:
            produced.append(token)
            stream(np.array([token]))
            if token in stop_tokens:
                break
        return it.tensor(np.array([prompt + produced]))


@pytest.mark.parametrize("name", ["qwen", "plain"])  # EOS <|im_end|>; EOS <|endoftext|> with ChatML tokens
def test_chat_replies_leave_out_special_tokens_and_end_at_the_end_of_turn(generate_script, hf_dirs, name,
                                                                          monkeypatch):
    from infini_train.data.tokenizer import get_tokenizer

    tok = get_tokenizer("hf:" + hf_dirs[name])
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    words = tok.encode("Paris is", add_special_tokens=False), tok.encode(" the capital", add_special_tokens=False)
    model = ScriptedModel([*words[0], start, *words[1], end, *tok.encode(" junk", add_special_tokens=False)])
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nagain\n\n"))
    args = SimpleNamespace(system=None, max_new_tokens=50, temperature=0.0, top_k=None, top_p=None, seed=1,
                           no_cache=False)
    out = io.StringIO()
    generate_script.chat(model, tok, args, it.backend.CPU, out)
    assert out.getvalue() == "Paris is the capital\n" * 2  # no <|im_start|>, nothing after <|im_end|>
    second_prompt = tok.decode(model.prompts[1])
    assert "<|im_start|>assistant\nParis is the capital<|im_end|>" in second_prompt, second_prompt
