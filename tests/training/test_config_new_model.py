"""A model the package does not ship, registered from here: a GPT-2 whose MLPs are ``mlp_ratio`` x n_embd wide, under
the arch gpt2_wide with a run-config key of its own. The run config takes its arch and key, documents them, checks
them (range, keys of other archs, layout) and builds the model without a line of training/ knowing it; and reading a
config imports the families' small section modules, not their models."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import infini_train as it
from infini_train import nn
from infini_train.models import registry
from infini_train.models.gpt2 import GPT2, GPT2Config, SPEC as GPT2_SPEC
from infini_train.models.gpt2.section import GPT2Section
from infini_train.models.model_section import AT_LEAST_ONE, RunKey
from infini_train.models.registry import ModelSpec
from infini_train.training.config import ConfigError, RunConfig, config_keys, load_config, parse_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class WideConfig(GPT2Config):
    mlp_ratio: int = 4

    def __post_init__(self):
        super().__post_init__()
        if self.mlp_ratio < 1:
            raise ValueError(f"WideConfig.mlp_ratio: expected a positive integer, got {self.mlp_ratio}")


class WideGPT2(GPT2):
    def __init__(self, config):
        super().__init__(config)
        width = config.mlp_ratio * config.n_embd
        for block in self.transformer.h:
            block.mlp.c_fc = nn.Linear(config.n_embd, width, bias=config.bias)
            block.mlp.c_proj = nn.Linear(width, config.n_embd, bias=config.bias)
        self.apply(self._init_weights)


SECTION = GPT2Section("gpt2_wide", __name__, keys=(RunKey("mlp_ratio", int, "gpt2_wide: MLP width / n_embd; null: 4",
                                                          AT_LEAST_ONE),),
                      preset_keys=("n_layer", "n_head", "n_embd"), preset_doc="d12, ...")
SPEC = ModelSpec("gpt2_wide", WideGPT2, WideConfig, GPT2_SPEC.tensor_parallel, GPT2_SPEC.head_counts)
SHAPE = ["model.arch=gpt2_wide", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=64"]


@pytest.fixture
def wide():
    registry.register_section(SECTION)
    registry.register(SPEC)
    yield
    registry.unregister("gpt2_wide")


def _errors(*overrides):
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return info.value.errors


def test_a_registered_model_brings_its_arch_and_key_to_the_run_config(wide, capsys):
    cfg = load_config(None, [*SHAPE, "model.mlp_ratio=2"])
    assert cfg.model.mlp_ratio == 2 and cfg.to_dict()["model"]["mlp_ratio"] == 2
    assert cfg.model.to_model_config() == WideConfig(block_size=64, n_layer=2, n_head=2, n_embd=32, mlp_ratio=2)
    assert load_config(None, SHAPE).model.to_model_config().mlp_ratio == 4  # null: the config class's default
    assert RunConfig.from_dict(cfg.to_dict()).model == cfg.model
    assert "model.mlp_ratio" in config_keys()
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    listing = capsys.readouterr().out
    assert "gpt2_wide: MLP width / n_embd; null: 4" in listing and "| deepseek_v3 | gpt_oss | gpt2_wide" in listing
    with pytest.raises(SystemExit):  # --print-config fills the key from the built model
        parse_args([*SHAPE, "--print-config"])
    assert yaml.safe_load(capsys.readouterr().out)["model"]["mlp_ratio"] == 4


def test_a_registered_model_is_checked_by_its_section_and_spec(wide):
    assert _errors(*SHAPE, "model.mlp_ratio=0") == ["model.mlp_ratio: expected an integer >= 1, got 0"]
    assert _errors("model.mlp_ratio=2") == [
        "model.mlp_ratio: only for model.arch=gpt2_wide, got 2 with model.arch=gpt2; HINT: set model.arch=gpt2_wide, "
        "or drop the key"]
    assert _errors(*SHAPE, "model.n_kv_head=2")[0].startswith("model.n_kv_head: only for model.arch=llama3 | qwen3")
    assert _errors(*SHAPE, "model.n_embd=33") == [
        "model.n_head: expected n_embd (33) divisible by n_head (2), got n_embd % n_head = 1"]  # GPT-2's section check
    assert _errors(*SHAPE, "parallel.tensor=4", "parallel.sequence=true") == [  # the spec's layout check
        "parallel.tensor: expected a divisor of model n_head (2; each rank takes n_head / tensor heads), got 4; HINT: "
        "use one of [1, 2]"]
    assert _errors(*SHAPE, "model.preset=d13")[0].startswith("model.preset: expected one of ['d12', ")
    assert _errors(*SHAPE, "parallel.expert=2")[0].startswith(
        "parallel.expert: expected 1 for model.arch=gpt2_wide (expert parallelism splits the experts")


def test_the_run_builds_a_registered_model(wide):
    from infini_train.training.model_build import build_model

    cfg = load_config(None, [*SHAPE, "model.mlp_ratio=3", "model.vocab_size=257", "train.sequence_length=16",
                             "data.tokenizer=byte"])
    plan, _, _ = build_model(cfg, "cpu")
    model = plan.model
    assert type(model) is WideGPT2 and registry.arch_of(model) == "gpt2_wide"
    assert tuple(model.transformer.h[0].mlp.c_fc.weight.shape) == (96, 32)
    logits, loss = model(it.tensor(np.arange(16).reshape(1, 16)), it.tensor(np.arange(1, 17).reshape(1, 16)))
    assert logits.shape == (1, 16, 257) and np.isfinite(loss.item())


def test_once_unregistered_the_arch_and_its_key_are_refused(wide):
    registry.unregister("gpt2_wide")
    errors = _errors(*SHAPE, "model.mlp_ratio=2")
    assert "model.mlp_ratio: unknown key" in errors[0]
    assert errors[1].startswith("model.arch: expected one of ('gpt2', 'llama3', 'qwen3', 'qwen3_moe', 'mixtral', "
                                "'deepseek_v3', 'gpt_oss')")
    assert errors[1].endswith("got 'gpt2_wide'")
    registry.register_section(SECTION)  # (for the fixture's unregister)


def test_reading_a_config_imports_the_sections_not_the_models():
    code = ("import sys; from infini_train.training.config import load_config; load_config(None); "
            "print(sorted(m for m in sys.modules if m.startswith('infini_train.models.llama')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                         capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["infini_train.models.llama", "infini_train.models.llama.section"]
