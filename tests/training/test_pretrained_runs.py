"""Runs that start from a trained model (``model.pretrained``: an HF directory): the arch, shape and weights come from
it -- the first step's loss is HF's on the same batch, each rank reads only its part (TP2 gives the one process's
steps), LoRA's base defaults to it -- and the config refuses what it cannot mean."""
import os

import numpy as np
import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

from infini_train.data.loader import DistributedDataLoader
from infini_train.run_state import list_checkpoints, load_checkpoint
from infini_train.training.config import ConfigError, load_config
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import losses_by_step, run

B, T = 2, 16


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = LlamaForCausalLM(HFLlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None,
                                        eos_token_id=None, pad_token_id=10))  # (newlines: no gradient, as in HF)
    out = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(out)
    return out


def write_config(directory, hf_dir, data_dir, extra=""):
    path = directory / "run.yaml"
    path.write_text(f"""model:
  pretrained: {hf_dir}
data:
  train: {data_dir}/train_*.bin
  val: null
  tokenizer: byte
  source: null
train:
  batch_size: {B}
  sequence_length: {T}
  total_batch_size: {B * T}
  num_iterations: 3
  learning_rate: 1.0e-3
  warmup_iters: 0
  val_loss_every: 0
  sample_every: 0
  log_every: 1
plot: false
device: cpu
{extra}""")
    return str(path)


def _train(config, out, *extra, ranks=1):
    return run([f"out_dir={out}", *extra], ranks=ranks, config=config)


def test_full_fine_tuning_starts_from_the_hf_weights(data_dir, hf_dir, tmp_path):
    config = write_config(tmp_path, hf_dir, data_dir)
    cfg = load_config(config)
    assert cfg.model.arch == "llama3" and cfg.model.to_model_config().dim == 32
    proc = _train(config, tmp_path / "one", "train.learning_rate=1e-12", "train.weight_decay=0")
    assert "world 1" in proc.stdout
    hf = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    x, y = DistributedDataLoader(f"{data_dir}/train_*.bin", B, T).next_batch()
    logits = hf(torch.tensor(x)).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 300), torch.tensor(y).reshape(-1)).item()
    np.testing.assert_allclose(losses_by_step(tmp_path / "one")[0], expected, rtol=1e-5)
    weights, _, _ = load_checkpoint(list_checkpoints(tmp_path / "one")[-1])  # AdamW moved them by ~1e-12: HF's
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(np.asarray(weights[name]), p.detach().numpy(), rtol=1e-6, atol=1e-11, err_msg=name)


@needs_mpiexec
def test_tensor_parallel_ranks_read_their_shards(data_dir, hf_dir, tmp_path):
    config = write_config(tmp_path, hf_dir, data_dir)
    _train(config, tmp_path / "one")
    proc = _train(config, tmp_path / "tp2", "parallel.tensor=2", ranks=2)
    assert "tensor parallel 2" in proc.stdout
    one, tp2 = losses_by_step(tmp_path / "one"), losses_by_step(tmp_path / "tp2")
    np.testing.assert_allclose([tp2[s] for s in sorted(tp2)], [one[s] for s in sorted(one)], rtol=1e-5)


def test_lora_base_defaults_to_the_pretrained_model(data_dir, hf_dir, tmp_path):
    config = write_config(tmp_path, hf_dir, data_dir, "lora:\n  rank: 4\n  target_modules: q_proj,v_proj\n")
    assert load_config(config).lora.init_from == str(hf_dir)
    _train(config, tmp_path / "lora")
    assert os.path.isfile(tmp_path / "lora" / "adapter" / "adapter_model.safetensors")


def test_pretrained_refusals(data_dir, hf_dir, tmp_path):
    config = write_config(tmp_path, hf_dir, data_dir)

    def errors(*overrides):
        with pytest.raises(ConfigError) as info:
            load_config(config, list(overrides))
        return info.value.errors

    assert errors("model.n_layer=4") == [
        "model.n_layer: expected no value with model.pretrained (the pretrained model's config decides n_layer), got "
        "4; HINT: drop the key, or drop model.pretrained to build a model of your own shape"]
    assert errors("model.arch=qwen3") == [
        "model.arch: expected 'llama3' (the arch of model.pretrained " + repr(str(hf_dir)) + "), got 'qwen3'; HINT: "
        "drop model.arch, it comes from the pretrained model"]
    missing = errors(f"model.pretrained={tmp_path / 'nowhere'}")
    assert missing[0].startswith("model.pretrained: expected an HF model directory or an llm.c .bin file, got ")
    assert "no such file or directory" in missing[0]
    assert load_config(config, ["model.dropout=0.1"]).model.to_model_config().dropout == 0.1
