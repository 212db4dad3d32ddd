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


@pytest.fixture(scope="module")
def tokenizer_of_261(tmp_path_factory):
    """A Hugging Face tokenizer of 261 tokens (256 bytes + 5 special): 4 more than the byte-sized model."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    from tests.data.sft_tokenizers import train_tiny_llama3

    directory = str(tmp_path_factory.mktemp("tokenizer_261"))
    assert len(train_tiny_llama3(directory, vocab_size=261)) == 261
    return directory


def test_an_hf_tokenizer_larger_than_the_vocabulary_is_refused_before_the_run(tokenizer_of_261, tmp_path):
    from tests.training.tiny_run import CONFIG, run

    tokenizer = f"data.tokenizer=hf:{tokenizer_of_261}"
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, [tokenizer])
    assert info.value.errors == [
        f"model.vocab_size: expected >= 261 for data.tokenizer 'hf:{tokenizer_of_261}', got 257; HINT: set "
        "model.vocab_size=320 (>= 261; a multiple of 64 runs faster), or use the tokenizer the model was made for"]
    assert load_config(CONFIG, [tokenizer, "model.vocab_size=261"]).model.vocab_size == 261
    proc = run([tokenizer, f"out_dir={tmp_path}/run", "train.num_iterations=1"], check=False)
    assert proc.returncode == 1 and proc.stdout == ""  # refused before any work: no corpus, no step line
    assert proc.stderr.startswith("error: invalid run configuration") and "expected >= 261" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
