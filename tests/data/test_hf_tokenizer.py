"""hf:PATH tokenizers against transformers' PreTrainedTokenizerFast.from_pretrained on the same directories
(tests/data/hf_dirs.py): encodings, decodings, special token ids, and the errors."""
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from infini_train.data.hf_tokenizer import HFTokenizer, HFTokenizerError
from infini_train.data.tokenizer import get_tokenizer

transformers = pytest.importorskip("transformers")

NAMES = ("llama3", "qwen", "strict", "plain", "bert")
TEXTS = [
    "",
    "Hello world!",
    " leading space, trailing space ",
    "  runs   of   spaces\t\ttabs\n\n\nnewlines\r\n  ",
    "héllo wörld ✓ 𝛑 日本語のテキスト 🙂🚀 Ωmega ॐ ﬁ",
    "special <|eot_id|> inside<|im_start|>user\ntext<|im_end|></s><s> <mask><image> <tool>x [SEP]",
    "<|begin_of_text|>",
    "<|begin_of_text|><|begin_of_text|>",
    "def f(x):\n    return {'a': x ** 2}  # it's fine, isn't it ?",
    "unseen: \x00\x01 \u200b zero-width, ʕ•ᴥ•ʔ, 𓀀, \U0010ffff",
]


@pytest.fixture(scope="module")
def pairs(hf_dirs):
    """{name: (ours, transformers')}"""
    return {name: (get_tokenizer("hf:" + hf_dirs[name]),
                   transformers.PreTrainedTokenizerFast.from_pretrained(hf_dirs[name])) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_encode_and_decode_equal_transformers(pairs, name):
    ours, ref = pairs[name]
    assert isinstance(ours, HFTokenizer) and ours.accepts_bytes is False
    for text in TEXTS:
        for add in (True, False):
            ids = ref.encode(text, add_special_tokens=add)
            assert ours.encode(text, add_special_tokens=add) == ids, (text, add)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
        assert ours.encode(text) == ref.encode(text)
        arr = ours.encode_array(text)
        assert arr.dtype == np.uint16 and arr.tolist() == ref.encode(text)
    rng = random.Random(0)
    for _ in range(40):  # any ids, special ones among them
        ids = [rng.randrange(len(ref)) for _ in range(rng.randrange(30))]
        for skip in (False, True):
            assert ours.decode(np.array(ids, dtype=np.int64), skip_special_tokens=skip) == \
                ref.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("name", NAMES)
def test_vocabulary_and_special_tokens_equal_transformers(pairs, hf_dirs, name):
    ours, ref = pairs[name]
    assert ours.name == "hf:" + os.path.abspath(hf_dirs[name])
    assert ours.vocab_size == len(ref)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == \
        (ref.bos_token_id, ref.eos_token_id, ref.pad_token_id)
    assert ours.special_tokens == ref.special_tokens_map
    assert ours.eot_token == ref.eos_token_id


def test_special_token_ids_of_each_layout(pairs):
    llama, qwen, strict, plain, bert = (pairs[n][0] for n in NAMES)
    tok = llama.token_to_id
    assert (llama.bos_token_id, llama.eos_token_id, llama.pad_token_id) == \
        (tok("<|begin_of_text|>"), tok("<|end_of_text|>"), None)
    assert llama.stop_token_ids == [tok("<|end_of_text|>"), tok("<|eot_id|>")]  # generation_config.json's too
    assert llama.encode("hi")[0] == llama.bos_token_id and llama.encode("hi", add_special_tokens=False)[0] != 0
    assert qwen.bos_token_id is None and qwen.eos_token_id == qwen.token_to_id("<|im_end|>") == qwen.eot_token
    assert qwen.pad_token_id == qwen.token_to_id("<|endoftext|>") and qwen.stop_token_ids == [qwen.eos_token_id]
    ids = strict.encode("hi")  # add_bos_token and add_eos_token, written into tokenizer.json's post-processor
    assert (ids[0], ids[-1]) == (strict.bos_token_id, strict.eos_token_id)
    assert strict.special_tokens["image_token"] == "<image>"
    assert plain.eos_token_id == plain.token_to_id("<|endoftext|>") and plain.vocab_size == 601  # <mask> added
    assert plain.encode("a<mask>b", add_special_tokens=False)[1] == plain.token_to_id("<mask>")
    assert bert.eos_token_id is None and bert.eot_token is None and bert.stop_token_ids == []


def test_a_tokenizer_json_file_and_the_package_interface(hf_dirs, tmp_path):
    path = os.path.join(hf_dirs["llama3"], "tokenizer.json")
    tok = get_tokenizer("hf:" + path)  # the settings files beside it are read too
    assert tok.name == "hf:" + path and tok.encode("hi") == get_tokenizer("hf:" + hf_dirs["llama3"]).encode("hi")
    assert tok.stop_token_ids == get_tokenizer("hf:" + hf_dirs["llama3"]).stop_token_ids
    os.symlink(path, tmp_path / "alone.json")  # no settings beside it: no special tokens named
    alone = get_tokenizer(f"hf:{tmp_path / 'alone.json'}")
    assert alone.eos_token_id is None and alone.eot_token == alone.token_to_id("<|endoftext|>")  # the first known
    assert get_tokenizer("byte").name == "byte"  # the other names as before


def test_ids_beyond_uint16_give_uint32_arrays(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "small": 1, "big": 70000}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    words = get_tokenizer(f"hf:{tmp_path}")
    assert words.encode_array("small small").dtype == np.uint16
    arr = words.encode_array("small big other")
    assert arr.dtype == np.uint32 and arr.tolist() == words.encode("small big other") == [1, 70000, 0]


def test_errors_name_the_path_and_what_to_do(hf_dirs, tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(HFTokenizerError, match=rf"tokenizer 'hf:{missing}': expected a Hugging Face model directory "
                                               rf"or a tokenizer.json file, got a path that does not exist .*\nHINT: "):
        get_tokenizer(f"hf:{missing}")
    with pytest.raises(HFTokenizerError, match=r"tokenizer 'hf:': expected a path after 'hf:', got nothing\nHINT"):
        get_tokenizer("hf:")
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "tokenizer.model").write_bytes(b"x")
    (tmp_path / "slow" / "config.json").write_text("{}")
    with pytest.raises(HFTokenizerError, match=r"expected tokenizer.json in .*slow, got a directory without it \(it "
                                               r"holds config.json, tokenizer.model\)\nHINT: it has tokenizer.model: "
                                               r"write tokenizer.json once with transformers"):
        get_tokenizer(f"hf:{tmp_path / 'slow'}")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(HFTokenizerError, match=r"tokenizer.json: expected a tokenizers JSON file, got one it cannot "
                                               r"read"):
        get_tokenizer(f"hf:{tmp_path / 'bad'}")
    (tmp_path / "badcfg").mkdir()
    os.symlink(os.path.join(hf_dirs["qwen"], "tokenizer.json"), tmp_path / "badcfg" / "tokenizer.json")
    (tmp_path / "badcfg" / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(HFTokenizerError, match=r"tokenizer_config.json: expected a JSON object, got list"):
        get_tokenizer(f"hf:{tmp_path / 'badcfg'}")
    tok = get_tokenizer("hf:" + hf_dirs["qwen"])
    with pytest.raises(TypeError, match=r"encode expected a str, got bytes\nHINT: decode bytes as UTF-8 first"):
        tok.encode(b"bytes")
    with pytest.raises(ValueError, match=r"decode expected token ids >= 0, got -1"):
        tok.decode([5, -1])
    with pytest.raises(ValueError, match=r"decode expected one sequence of ids, got an array of shape \(1, 2\)"):
        tok.decode([[5, 6]])


def test_the_package_imports_without_tokenizers_and_says_what_to_install(hf_dirs):
    code = ("import sys; sys.modules['tokenizers'] = None; sys.modules['jinja2'] = None\n"
            "import infini_train, infini_train.data.hf_tokenizer, infini_train.data.chat_template\n"
            "from infini_train.data.tokenizer import get_tokenizer\n"
            "assert get_tokenizer('byte').name == 'byte'\n"
            "try:\n    get_tokenizer('hf:' + sys.argv[1])\nexcept ImportError as e:\n    print(e)\n"
            "from infini_train.data.chat_template import render_chat_template\n"
            "try:\n    render_chat_template('{{ 1 }}', [{'role': 'user', 'content': 'x'}])\n"
            "except ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, hf_dirs["qwen"]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ("tokenizer 'hf:PATH' needs the tokenizers package, which is not installed\nHINT: pip "
                          "install -e '.[tokenizers]' (tokenizers==0.23.3 and Jinja2==3.1.6)\n"
                          "chat templates need Jinja2, which is not installed\nHINT: pip install -e '.[tokenizers]' "
                          "(or pip install Jinja2==3.1.6)\n")


def test_unknown_names_still_suggest_the_closest():
    with pytest.raises(ValueError, match=r"unknown tokenizer 'gtp2': expected one of \('byte', 'gpt2', 'auto'\)\n"
                                         r"HINT: did you mean 'gpt2'\? .*hf:PATH reads a Hugging Face model"):
        get_tokenizer("gtp2")


def test_shards_record_the_hf_name(hf_dirs, tmp_path):
    from infini_train.data.corpus import prepare_shards
    from infini_train.data.shards import read_shard

    name = "hf:" + hf_dirs["llama3"]
    meta = prepare_shards(["first document", "second, héllo"], str(tmp_path), name, val_tokens=0)
    tok = get_tokenizer(name)
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == (tok.name, 600, tok.eos_token_id)
    eot = tok.eot_token
    assert read_shard(str(tmp_path / "train_000000.bin")).tolist() == \
        [eot] + tok.encode("first document") + [eot] + tok.encode("second, héllo")


def test_a_run_config_with_an_hf_tokenizer_loads(hf_dirs, tmp_path, monkeypatch):
    from infini_train.training.config import ConfigError, load_config
    from infini_train.training.model_build import tokenizer_name

    monkeypatch.chdir(os.path.dirname(hf_dirs["qwen"]))
    (tmp_path / "run.yaml").write_text("data:\n  tokenizer: hf:qwen\n  train: shards/train_*.bin\n  source: null\n")
    cfg = load_config(str(tmp_path / "run.yaml"))
    assert cfg.data.tokenizer == "hf:" + hf_dirs["qwen"]  # absolute: the saved config works from anywhere
    assert load_config(str(tmp_path / "run.yaml"), ["data.tokenizer=hf:llama3/tokenizer.json"]).data.tokenizer == \
        "hf:" + os.path.join(hf_dirs["llama3"], "tokenizer.json")
    cfg.save_resolved(str(tmp_path / "out"))
    assert load_config(str(tmp_path / "out" / "config.yaml")).data.tokenizer == "hf:" + hf_dirs["qwen"]
    # shards made with the tokenizer (their meta.json names it absolutely) agree with the config's relative name
    from infini_train.data.corpus import prepare_shards

    prepare_shards(["a document", "another"], "shards", "hf:qwen", val_tokens=0)
    assert tokenizer_name(cfg) == ("hf:" + hf_dirs["qwen"], 600)
    with pytest.raises(ConfigError, match=r"data.tokenizer: the shards under shards were made with 'hf:.*qwen', but "
                                          r"the config says 'byte'"):
        tokenizer_name(load_config(str(tmp_path / "run.yaml"), ["data.tokenizer=byte"]))
    for value, line in [
        ("hf:missing", f"data.tokenizer: expected a Hugging Face model directory or a tokenizer.json file, got a path "
                       f"that does not exist ({os.path.join(os.getcwd(), 'missing')}); HINT: download the model"),
        ("hf:", "data.tokenizer: expected a path after 'hf:', got nothing; HINT: data.tokenizer=hf:PATH"),
        ("hf:shards", "data.tokenizer: expected tokenizer.json in"),
        ("qwen", "data.tokenizer: expected one of ('byte', 'gpt2', 'auto') or hf:PATH (a Hugging Face model directory "
                 "or its tokenizer.json), got 'qwen' (did you mean 'hf:qwen'?)"),
        ("gtp2", "got 'gtp2' (did you mean 'gpt2'?)"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"data.tokenizer={value}"])
        assert len(info.value.errors) == 1 and line in info.value.errors[0], info.value.errors


def test_a_run_config_says_what_to_install(hf_dirs, monkeypatch):
    from infini_train.training.config import ConfigError, load_config

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ConfigError, match=r"data.tokenizer: hf:PATH needs the tokenizers and Jinja2 packages, which "
                                          r"are not installed; HINT: pip install -e '.\[tokenizers\]'"):
        load_config(None, ["data.tokenizer=hf:" + hf_dirs["qwen"]])
