"""A preset and explicit architecture keys: a preset given on the command line replaces the config file's shape,
context and rope settings, explicit ones override the preset with a warning, a LLaMA preset works without --config,
llama3 rope scaling needs its original context below block_size (as transformers requires), and lora.init_from
needs lora.rank."""
import os

import pytest

from infini_train.models.llama.config import LLAMA_PRESETS
from infini_train.training.config import REPO_ROOT, ConfigError, load_config, parse_args

LLAMA_TINY = os.path.join(REPO_ROOT, "configs", "llama3_tiny.yaml")


def _shape(cfg):
    model = cfg.model.to_model_config()
    return model.n_layers, model.dim, model.n_heads, model.n_kv_heads, model.intermediate_size


ONE_B = LLAMA_PRESETS["llama3.2-1b"]


def test_a_command_line_preset_replaces_the_config_files_shape(tmp_path):
    cfg = load_config(LLAMA_TINY, ["model.preset=llama3.2-1b"])
    assert _shape(cfg) == (16, 2048, 32, 8, 8192)
    assert cfg.warnings == []
    model = cfg.model.to_model_config()  # the preset's context and rope, not the tiny file's
    assert (model.max_seq_len, model.rope_scaling, model.rope_theta) == (131072, ONE_B["rope_scaling"], 500000.0)
    # the saved config says what trains: the preset, no architecture keys; the file's vocabulary (its tokenizer's)
    assert (cfg.model.preset, cfg.model.n_layer, cfg.model.n_embd, cfg.model.rope_original_context) == \
           ("llama3.2-1b", None, None, None)
    assert cfg.model.vocab_size == 257
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert _shape(load_config(str(saved))) == _shape(cfg)


def test_an_explicit_shape_key_overrides_the_preset_with_a_warning():
    cfg = load_config(LLAMA_TINY, ["model.preset=llama3.2-1b", "model.n_layer=4"])
    assert _shape(cfg) == (4, 2048, 32, 8, 8192)
    assert cfg.warnings == ["model.n_layer=4 overrides model.preset=llama3.2-1b's 16 (the run's model is the preset's "
                            "with the explicit keys; drop the key, or pass it as null, for the preset's)"]
    cfg = load_config(None, ["model.preset=d12", "model.n_layer=2", "model.n_embd=768"])  # 768 is the preset's
    assert [w.split(" (")[0] for w in cfg.warnings] == ["model.n_layer=2 overrides model.preset=d12's 12"]


def test_shape_keys_and_a_preset_in_one_file_warn_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  arch: llama3\n  preset: llama3.2-1b\n  n_head: 16\n  n_kv_head: 8\n")
    cfg = load_config(str(path))
    assert [w.split(" (")[0] for w in cfg.warnings] == ["model.n_head=16 overrides model.preset=llama3.2-1b's 32"]
    assert _shape(cfg)[2:4] == (16, 8)


def test_a_llama_preset_needs_no_config_file():
    cfg = parse_args(["model.arch=llama3", "model.preset=llama3.2-1b", "train.sequence_length=64"])
    assert _shape(cfg) == (16, 2048, 32, 8, 8192) and cfg.warnings == []


def test_llama3_rope_scaling_needs_the_original_context_below_block_size():
    with pytest.raises(ConfigError, match=r"model.rope_original_context: expected rope_original_context \(64\) < "
                                          r"block_size \(64\) with llama3 rope scaling .*HINT"):
        load_config(LLAMA_TINY, ["model.rope_original_context=64"])
    with pytest.raises(ConfigError, match=r"model.block_size: expected rope_original_context \(8192\) < block_size "
                                          r"\(64\)"):  # the default original context
        load_config(LLAMA_TINY, ["model.rope_original_context=null"])
    cfg = load_config(LLAMA_TINY, ["model.rope_original_context=null", "model.rope_scaling_factor=0"])
    assert cfg.model.to_model_config().rope_scaling is None
    # without a preset or a rope scaling key there is no scaling (transformers' LlamaConfig default)
    cfg = load_config(None, ["model.arch=llama3", "model.n_layer=2", "model.n_head=4", "model.n_embd=64"])
    assert cfg.model.to_model_config().rope_scaling is None
    cfg = load_config(None, ["model.arch=llama3", "model.n_head=4", "model.n_embd=64",
                             "model.rope_original_context=32"])
    assert cfg.model.to_model_config().rope_scaling == dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                            original_max_position_embeddings=32)


def test_lora_init_from_without_a_rank_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"lora.init_from: the base weights of a LoRA run, used only with lora.rank > "
                                          r"0; got lora.init_from='.*' with lora.rank=0, which would train from "
                                          r"scratch; HINT: set lora.rank"):
        load_config(None, [f"lora.init_from={tmp_path}"])
    assert load_config(None, [f"lora.init_from={tmp_path}", "lora.rank=4"]).lora.rank == 4


@pytest.mark.parametrize("overrides", [["model.preset=d12"], ["model.arch=llama3", "model.preset=llama3.2-1b"],
                                       ["model.arch=qwen3_moe", "model.preset=qwen3-30b-a3b"],
                                       ["model.arch=qwen3", "model.preset=null"]])
def test_print_config_shows_the_presets_shape_and_loads_back_to_the_same_model(overrides, capsys, tmp_path):
    import yaml

    args = ["--config", os.path.join(REPO_ROOT, "configs", "gpt2_124m.yaml"), *overrides, "model.vocab_size=null"]
    cfg = parse_args(args)
    with pytest.raises(SystemExit) as info:
        parse_args([*args, "--print-config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    model = yaml.safe_load(printed)["model"]
    built = cfg.model.to_model_config()
    assert model["preset"] == cfg.model.preset and model["vocab_size"] == built.vocab_size
    assert (model["n_layer"], model["n_embd"], model["block_size"]) == \
        ((built.n_layer, built.n_embd, built.block_size) if model["arch"] == "gpt2"
         else (built.n_layers, built.dim, built.max_seq_len))
    assert model["pretrained"] is None and None not in [v for k, v in model.items() if k in ("n_head", "dropout")]
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)
    again = load_config(str(saved))
    assert again.model.to_model_config() == built and again.warnings == []
