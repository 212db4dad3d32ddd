"""Qwen3 against transformers' Qwen3ForCausalLM on small random configs with grouped-query attention, a head_dim
that is not hidden / heads, per-head q_norm / k_norm, tied and untied embeddings: logits, loss, every gradient,
greedy generation with the KV cache, HF directories both ways; and it.models.from_pretrained for every model_type."""
import json

import numpy as np
import pytest
from transformers import Qwen3Config as HFQwen3Config
from transformers import Qwen3ForCausalLM

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.gpt2.io import WeightsError
from infini_train.models.llama import Llama, LlamaConfig
from infini_train.models.llama.qwen3 import Qwen3, Qwen3Config
from infini_train.models.registry import model_spec, spec_of

from .hf_lm_checks import check_directories_both_ways, check_forward_backward, check_generation, randomize

VOCAB = 97


def hf_config(tie=False, kv=2, **extra):
    return HFQwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv, head_dim=16, max_position_embeddings=128,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                         tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None, pad_token_id=0, **extra)


def pair(tmp_path, seed=0, **config):
    hf = randomize(Qwen3ForCausalLM(hf_config(**config)), seed)
    hf.save_pretrained(tmp_path / "start")
    return Qwen3.from_pretrained(tmp_path / "start"), hf


@pytest.mark.parametrize("tie,kv", [(False, 2), (True, 1)], ids=["gqa", "tied-mqa"])
def test_logits_loss_and_every_gradient_match_hf(tmp_path, tie, kv):
    ours, hf = pair(tmp_path, tie=tie, kv=kv)
    cfg = ours.config
    assert (cfg.head_dim, cfg.dim // cfg.n_heads, cfg.n_kv_heads, cfg.qk_norm) == (16, 8, kv, True)
    assert ours.model.layers[0].self_attn.q_norm.weight.shape == (16,)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tie
    check_forward_backward(ours, hf, VOCAB)


@pytest.mark.parametrize("kv", [2, 1])
def test_greedy_generation_with_the_kv_cache_is_token_identical_to_hf(tmp_path, kv):
    ours, hf = pair(tmp_path, seed=4, kv=kv)
    check_generation(ours, hf, VOCAB)
    assert ours.new_kv_cache(2, "cpu").keys[0].shape == (2, kv, 128, 16)


def test_hf_directories_both_ways_single_and_sharded(tmp_path):
    ours, hf = pair(tmp_path, seed=5, tie=True)
    out = check_directories_both_ways(ours, hf, Qwen3ForCausalLM, Qwen3, tmp_path, VOCAB, max_shard_size="20KB")
    assert (out / "model.safetensors.index.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["head_dim"] == 16 and config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]


def test_from_pretrained_picks_the_class_by_model_type(tmp_path):
    it.manual_seed(0)
    gpt2 = GPT2(GPT2Config(block_size=16, vocab_size=50, n_layer=1, n_head=2, n_embd=8))
    llama = Llama(LlamaConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=24,
                              max_seq_len=32, rope_scaling=None))
    x = it.tensor(np.random.default_rng(0).integers(0, 50, (1, 7)))
    for model, cls in ((gpt2, GPT2), (llama, Llama)):
        model.save_pretrained(tmp_path / cls.__name__)
        loaded = it.models.from_pretrained(tmp_path / cls.__name__)
        assert type(loaded) is cls
        np.testing.assert_array_equal(loaded(x)[0].numpy(), model(x)[0].numpy())
    gpt2.save_llmc(tmp_path / "model.bin")
    assert type(it.models.from_pretrained(tmp_path / "model.bin")) is GPT2
    config = json.loads((tmp_path / "Llama" / "config.json").read_text())
    (tmp_path / "Llama" / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(WeightsError, match="model_type 'bert' is not supported; expected one of"):
        it.models.from_pretrained(tmp_path / "Llama")
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        it.models.from_pretrained(tmp_path)


def test_spec_sliding_window_and_config(tmp_path):
    model = Qwen3(Qwen3Config(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                              intermediate_size=48, max_seq_len=64))
    assert spec_of(model).arch == "qwen3" and model_spec("qwen3").model_class is Qwen3
    llama = Llama(LlamaConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=8))
    assert spec_of(llama).arch == "llama3"  # (Qwen3 is a Llama: the spec of the class itself)
    assert Qwen3Config(**model.config.to_dict()) == model.config  # as checkpoints store it
    hf = Qwen3ForCausalLM(hf_config(use_sliding_window=True, sliding_window=16))
    hf.save_pretrained(tmp_path / "window")
    with pytest.raises(WeightsError, match="sliding_window 16 .* is not supported"):
        it.models.from_pretrained(tmp_path / "window")
    from infini_train.training.config import load_config
    assert type(load_config(None, ["model.arch=qwen3"]).model.to_model_config()) is Qwen3Config  # a run config's
    group = type("Group", (), {"size": 2})()
    with pytest.raises(ValueError, match="needs parallel.sequence=true"):
        spec_of(model).tensor_parallel(model, group, False)
