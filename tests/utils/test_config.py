import glob

import pytest

from infini_train.utils.config import ConfigError, RunConfig, load_config


def write(tmp_path, text):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return str(p)


def test_unknown_key_suggests_nearest_including_across_sections(tmp_path):
    path = write(tmp_path, "train:\n  learnin_rate: 0.1\nmodel:\n  n_layers: 2\nlearning_rate: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "train.learnin_rate: unknown key (did you mean 'train.learning_rate'?)" in msg
    assert "model.n_layers: unknown key (did you mean 'model.n_layer'?)" in msg
    assert "learning_rate: unknown key (did you mean 'train.learning_rate'?)" in msg


def test_wrong_types_and_ranges_all_reported_at_once(tmp_path):
    path = write(tmp_path, "train:\n  batch_size: eight\n  beta2: 1.5\n  weight_decay: -1\nseed: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "train.batch_size: expected int, got 'eight' (str)" in msg
    assert "seed: expected int, got True (bool)" in msg
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "train:\n  beta2: 1.5\n  weight_decay: -1\n  warmup_iters: -3\n"))
    msg = str(info.value)
    assert "train.beta2: expected a number in [0, 1), got 1.5" in msg
    assert "train.weight_decay: expected a number >= 0, got -1.0" in msg
    assert "train.warmup_iters: expected an integer >= 0 (0 disables), got -3" in msg


def test_bad_preset_and_sequence_longer_than_block(tmp_path):
    with pytest.raises(ConfigError, match="model.preset: expected one of .*, got 'gpt-2' \\(did you mean 'gpt2'\\?\\)"):
        load_config(None, ["model.preset=gpt-2"])
    with pytest.raises(ConfigError, match=r"train.sequence_length: expected <= model block_size \(64\), got 128"):
        load_config(None, ["model.block_size=64", "train.sequence_length=128"])


def test_overrides_are_coerced_and_applied(tmp_path):
    cfg = load_config(write(tmp_path, "train:\n  learning_rate: 1e-3\n"),
                      ["train.learning_rate=3e-4", "out_dir=runs/x", "train.overfit_single_batch=true",
                       "model.preset=d12", "model.n_layer=2"])
    assert cfg.train.learning_rate == 3e-4 and isinstance(cfg.train.learning_rate, float)
    assert cfg.out_dir == "runs/x" and cfg.train.overfit_single_batch is True
    gpt = cfg.model.to_gpt2_config()
    assert (gpt.n_layer, gpt.n_embd) == (2, 768)
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(None, ["train.learning_rate"])


def test_grad_accum_divisibility_is_checked():
    cfg = load_config(None, ["train.batch_size=4", "train.sequence_length=8", "train.total_batch_size=96"])
    assert cfg.grad_accum_steps(world_size=1) == 3
    with pytest.raises(ConfigError, match=r"train.total_batch_size: expected a multiple of .* = 64, got 96"):
        cfg.grad_accum_steps(world_size=2)


@pytest.mark.parametrize("path", sorted(glob.glob("configs/*.yaml")))
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("configs/gpt2_tiny.yaml", [f"out_dir={tmp_path}"])
    path = cfg.save_resolved()
    again = load_config(path)
    assert again == cfg
