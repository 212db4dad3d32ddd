"""data.format, data.packing and data.train_on_prompt: the config keys of supervised fine-tuning data."""
import pytest

from infini_train.training.config import ConfigError, config_keys, load_config

SFT = ["data.source=null", "data.val=null"]


def errors_of(overrides):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    return info.value.errors


def test_defaults_keep_todays_token_shards():
    cfg = load_config(None, [])
    assert (cfg.data.format, cfg.data.packing, cfg.data.train_on_prompt) == ("tokens", True, False)
    assert {"data.format", "data.packing", "data.train_on_prompt"} <= set(config_keys())


@pytest.mark.parametrize("fmt", ["text", "chat", "instruction"])
def test_sft_formats_take_jsonl_files_or_sft_shards(fmt):
    cfg = load_config(None, [f"data.format={fmt}", "data.train=data/x/*.jsonl", "data.val=data/x/val.jsonl",
                             "data.source=null", "data.packing=false", "data.train_on_prompt=true"])
    assert (cfg.data.format, cfg.data.packing, cfg.data.train_on_prompt) == (fmt, False, True)
    cfg = load_config(None, [f"data.format={fmt}", "data.train=d/train_*.sft", "data.val=d/val_*.sft",
                             "data.source=null"])
    assert cfg.data.train == "d/train_*.sft"


def test_sft_formats_refuse_token_shards_and_the_default_corpus():
    errors = errors_of(["data.format=chat", "data.train=d/train_*.bin"])
    assert errors == [
        "data.train: expected .jsonl file(s) or .sft shards (examples/gpt2/prepare_data.py --format chat) with "
        "data.format=chat, got 'd/train_*.bin'; HINT: token shards (.bin) are data.format=tokens",
        "data.val: expected .jsonl file(s) or .sft shards (examples/gpt2/prepare_data.py --format chat) with "
        "data.format=chat, got 'data/stdlib_byte/val_*.bin'; HINT: token shards (.bin) are data.format=tokens",
        "data.source: expected null with data.format=chat (the default corpus is token shards, built only for "
        "data.format=tokens), got 'stdlib'; HINT: add data.source=null"]
    assert errors_of(["data.format=text", "data.train=a.jsonl", "data.val=v.bin", "data.source=null"]) == [
        "data.val: expected .jsonl file(s) or .sft shards (examples/gpt2/prepare_data.py --format text) with "
        "data.format=text, got 'v.bin'; HINT: token shards (.bin) are data.format=tokens"]


def test_sft_formats_refuse_context_parallelism():
    assert errors_of(["data.format=chat", "data.train=a.jsonl", "data.val=null", "data.source=null",
                      "parallel.context=2"]) == [
        "parallel.context: expected 1 with data.format=chat (a row of samples attends within each sample; ring "
        "attention splits whole causal sequences only), got 2; HINT: use data, tensor or pipeline parallelism for "
        "fine-tuning"]


def test_tokens_refuses_jsonl_and_sft_shards():
    for pattern in ("data/chat.jsonl", "d/train_*.sft", "data/x.json"):
        errors = errors_of(["data.train=" + pattern, "data.source=null", "data.val=null"])
        assert errors == [f"data.train: expected llm.c token shards (.bin) with data.format=tokens, got {pattern!r}; "
                          "HINT: for JSONL samples set data.format=chat | instruction | text (their fields decide "
                          "which)"]
    # with the default data.source=stdlib, the format's error comes instead of the default corpus's name check
    assert errors_of(["data.train=data/chat.jsonl", "data.source=null", "data.val=v.jsonl"])[1].startswith(
        "data.val: expected llm.c token shards (.bin)")


def test_unknown_format_and_wrong_types():
    assert errors_of(["data.format=chta"]) == [
        "data.format: expected one of ('tokens', 'text', 'chat', 'instruction') (did you mean 'chat'?), got 'chta'"]
    assert errors_of(["data.format=instructions"])[0].startswith("data.format: expected one of ('tokens', 'text', "
                                                                 "'chat', 'instruction') (did you mean 'instruction'?)")
    errors = errors_of(["data.packing=maybe", "data.train_on_prompt=1"] + SFT)
    assert errors == ["data.packing: expected bool, got 'maybe' (str)", "data.train_on_prompt: expected bool, got 1 "
                                                                        "(int)"]
    assert errors_of(["data.fromat=chat"]) == ["data.fromat: unknown key (did you mean 'data.format'?)"]


def test_sft_config_round_trips_through_the_saved_yaml(tmp_path):
    cfg = load_config(None, ["data.format=instruction", "data.train=a.jsonl", "data.packing=false", "out_dir=" +
                             str(tmp_path)] + SFT)
    again = load_config(cfg.save_resolved())
    assert again.data == cfg.data
