"""python -m infini_train.tools.consolidate on one-process runs: a run's out_dir whose newest checkpoint is damaged
falls back to the newest good one with a warning; whole checkpoints export to HF (transformers as the oracle) and
llm.c; a LoRA run's checkpoint exports merged (--merge-lora) and as its PEFT adapter (peft as the oracle); the
whole-format directory honours the umask."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.gpt2 import GPT2
from infini_train.tools.consolidate import main as consolidate
from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.training.tiny_run import run, tiny_args

TOKENS = np.random.default_rng(0).integers(0, 257, (2, 16))
LORA = ["lora.rank=4", "lora.alpha=8", "lora.target_modules=c_attn,c_fc", "train.learning_rate=1e-2"]


@pytest.fixture(scope="module")
def full(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    run(tiny_args(data_dir, out, "train.num_iterations=4", "train.save_every=2", "train.val_loss_every=0"))
    return out


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory):
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf_base")
    GPT2LMHeadModel(HFConfig(vocab_size=257, n_positions=32, n_embd=64, n_layer=2, n_head=2)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def lora(data_dir, hf_base, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    run(tiny_args(data_dir, out, "train.num_iterations=4", "train.val_loss_every=0", *LORA,
                  f"lora.init_from={hf_base}"))
    return out


def _hf_logits(model):
    with torch.no_grad():
        return model.eval()(torch.tensor(TOKENS)).logits.numpy()


def _our_logits(model):
    model.eval()
    with it.no_grad():
        return model(it.tensor(TOKENS))[0].numpy()


def _assert_weights(model, weights):
    state = model.state_dict()
    assert sorted(state) == sorted(weights)
    for name, value in state.items():
        np.testing.assert_array_equal(value.numpy(), weights[name], err_msg=name)


def test_an_out_dir_whose_newest_checkpoint_is_damaged_falls_back_with_a_warning(full, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(full, out)
    good, damaged = list_checkpoints(out)
    with open(os.path.join(damaged, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    assert consolidate([str(out), str(tmp_path / "model.bin"), "--format", "llmc"]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipping checkpoint {damaged} is damaged: model.safetensors is truncated (100 bytes" in err
    assert f"; using {good}" in err
    _assert_weights(GPT2.from_pretrained(str(tmp_path / "model.bin")), load_checkpoint(good)[0])
    assert consolidate([damaged, str(tmp_path / "hf"), "--format", "hf"]) == 2  # named: it must verify
    err = capsys.readouterr().err
    assert f"error: checkpoint {damaged} is damaged: model.safetensors is truncated" in err
    assert f"HINT: use the newest good one, {good}, or pass the run's out_dir to take it" in err
    assert not os.path.exists(tmp_path / "hf")


def test_a_whole_checkpoint_exports_to_hf_and_llmc(full, tmp_path, capsys):
    from transformers import GPT2LMHeadModel

    newest = list_checkpoints(full)[-1]
    weights = load_checkpoint(newest)[0]
    assert consolidate([str(full), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert consolidate([newest, str(tmp_path / "model.bin"), "--format", "llmc"]) == 0
    ours = GPT2.from_pretrained(str(tmp_path / "model.bin"))
    _assert_weights(ours, weights)
    _assert_weights(GPT2.from_pretrained(str(tmp_path / "hf")), weights)
    hf = GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"))
    np.testing.assert_allclose(_our_logits(ours), _hf_logits(hf), rtol=1e-4, atol=1e-5)
    capsys.readouterr()
    assert consolidate([str(full), str(tmp_path / "again")]) == 2  # the whole format: nothing to consolidate
    assert f"error: {newest} is already a whole checkpoint" in capsys.readouterr().err


def test_a_lora_checkpoint_exports_merged_and_as_its_peft_adapter(lora, hf_base, full, tmp_path, capsys):
    from peft import PeftModel
    from transformers import GPT2LMHeadModel

    peft_dir = tmp_path / "adapter"
    assert consolidate([str(lora), str(peft_dir), "--format", "peft"]) == 0
    for name in ("adapter_config.json", "adapter_model.safetensors"):  # what the run wrote at its end
        assert (peft_dir / name).read_bytes() == (lora / "adapter" / name).read_bytes(), name
    config = json.loads((peft_dir / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8, str(hf_base))
    peft_model = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(str(hf_base)), str(peft_dir))
    expected = _hf_logits(peft_model)
    assert np.abs(expected - _hf_logits(GPT2LMHeadModel.from_pretrained(str(hf_base)))).max() > 1e-3  # it trained

    assert consolidate([str(lora), str(tmp_path / "merged"), "--format", "hf", "--merge-lora"]) == 0
    merged = GPT2LMHeadModel.from_pretrained(str(tmp_path / "merged"))
    np.testing.assert_allclose(_hf_logits(merged), expected, rtol=1e-4, atol=1e-5)
    assert consolidate([str(lora), str(tmp_path / "merged.bin"), "--format", "llmc", "--merge-lora"]) == 0
    ours = GPT2.from_pretrained(str(tmp_path / "merged.bin"))
    np.testing.assert_allclose(_our_logits(ours), expected, rtol=1e-4, atol=1e-5)
    hf_export = GPT2.from_pretrained(str(tmp_path / "merged"))  # the same merged weights in either format
    _assert_weights(ours, {k: v.numpy() for k, v in hf_export.state_dict().items()})

    capsys.readouterr()
    newest = list_checkpoints(lora)[-1]
    assert consolidate([str(lora), str(tmp_path / "plain"), "--format", "hf"]) == 2
    assert (f"error: --format hf: {newest} is a LoRA run's checkpoint (adapters and a reference to their base)\n"
            "HINT: pass --merge-lora for the base with the adapters merged in, or use --format peft for the adapter "
            "alone") in capsys.readouterr().err
    assert consolidate([str(full), str(tmp_path / "none"), "--format", "peft"]) == 2
    assert "(no LoRA adapters)\nHINT: use --format hf or llmc" in capsys.readouterr().err
    assert consolidate([str(full), str(tmp_path / "none"), "--format", "hf", "--merge-lora"]) == 2
    assert "(no LoRA adapters to merge)\nHINT: leave --merge-lora out" in capsys.readouterr().err
    assert consolidate([str(lora), str(tmp_path / "none"), "--merge-lora"]) == 2
    assert "error: --merge-lora: expected --format hf or llmc (a model file), got --format safetensors" in \
        capsys.readouterr().err
    assert not os.path.exists(tmp_path / "plain") and not os.path.exists(tmp_path / "none")


@pytest.mark.parametrize("umask,directory,files", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_the_whole_checkpoint_directory_honours_the_umask(data_dir, tmp_path, umask, directory, files):
    sharded = tmp_path / "sharded"
    run(tiny_args(data_dir, sharded, "train.num_iterations=2", "train.val_loss_every=0",
                  "train.checkpoint_format=sharded"))
    previous = os.umask(umask)
    try:
        assert consolidate([str(sharded), str(tmp_path / "whole")]) == 0
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "whole").st_mode & 0o777 == directory
    assert {name: os.stat(tmp_path / "whole" / name).st_mode & 0o777 for name in os.listdir(tmp_path / "whole")} == {
        "model.safetensors": files, "optimizer.safetensors": files, "state.json": files}
    whole, sharded_weights = load_checkpoint(tmp_path / "whole")[0], load_checkpoint(sharded)[0]
    assert sorted(whole) == sorted(sharded_weights)
    for name in whole:
        np.testing.assert_array_equal(whole[name], sharded_weights[name], err_msg=name)
