"""LLaMA-3 against Hugging Face transformers' LlamaForCausalLM on small random configs with grouped-query attention
and llama3 rope scaling: rotary frequencies, logits, loss and every gradient; HF directories both ways (single file,
sharded with an index, bfloat16 weights); greedy generation with the GQA-aware KV cache token for token."""
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM

import infini_train as it
from infini_train.models.gpt2.io import WeightsError
from infini_train.models.llama import Llama, LlamaConfig
from infini_train.models.llama.io import hf_config_to_llama

SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def hf_config(tie=False, kv=2, scaling=True, **extra):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, **SCALING} if scaling else \
        {"rope_type": "default", "rope_theta": 10000.0}
    return HFLlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=tie, eos_token_id=None,
                         bos_token_id=None, pad_token_id=0, **extra)


def hf_model(config, seed=0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms, so their gradients and values are exercised
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def ours_from(hf, tmp_path):
    hf.save_pretrained(tmp_path / "hf")
    return Llama.from_pretrained(tmp_path / "hf")


def batch(seed=1, B=2, T=24):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 97, (B, T)), rng.integers(0, 97, (B, T))


def test_rotary_frequencies_match_hf_llama3_and_default_rope():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for scaling in (True, False):
        hf = hf_config(scaling=scaling)
        ours = hf_config_to_llama(hf.to_dict(), "config")
        if scaling:
            expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
        else:
            expected = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float) / 16))
        np.testing.assert_allclose(ours.inv_freq(), expected.numpy(), rtol=1e-6)
    assert ours.rope_scaling is None and ours.rope_theta == 10000.0


@pytest.mark.parametrize("tie,kv", [(False, 2), (True, 1), (False, 4)], ids=["gqa", "tied-mqa", "mha"])
def test_logits_loss_and_every_gradient_match_hf(tmp_path, tie, kv):
    hf = hf_model(hf_config(tie=tie, kv=kv))
    ours = ours_from(hf, tmp_path)
    assert ours.config.n_kv_heads == kv and ours.config.tie_word_embeddings == tie
    x, y = batch()
    logits, loss = ours(it.tensor(x), it.tensor(y))
    hf.train()
    hf_logits = hf(torch.tensor(x)).logits
    hf_loss = torch.nn.functional.cross_entropy(hf_logits.reshape(-1, 97), torch.tensor(y).reshape(-1))
    np.testing.assert_allclose(logits.numpy(), hf_logits.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss.item(), hf_loss.item(), rtol=1e-5)
    loss.backward()
    hf_loss.backward()
    ours_params = dict(ours.named_parameters())
    for name, p in hf.named_parameters():
        if name not in ours_params:
            assert tie and name == "lm_head.weight"
            continue
        np.testing.assert_allclose(ours_params[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_save_pretrained_loads_in_hf_single_and_sharded(tmp_path):
    hf = hf_model(hf_config())
    ours = ours_from(hf, tmp_path)
    x, _ = batch(2)
    expected = hf(torch.tensor(x)).logits.detach().numpy()
    for max_shard in ("5GB", "20KB"):
        out = tmp_path / f"ours-{max_shard}"
        ours.save_pretrained(out, max_shard_size=max_shard)
        files = sorted(p.name for p in out.iterdir())
        if max_shard == "20KB":
            assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
            index = json.loads((out / "model.safetensors.index.json").read_text())
            assert set(index["weight_map"]) == set(hf.state_dict()) - {"model.rotary_emb.inv_freq"}
        else:
            assert files == ["config.json", "model.safetensors"]
        again = LlamaForCausalLM.from_pretrained(out).eval()
        np.testing.assert_allclose(again(torch.tensor(x)).logits.detach().numpy(), expected, rtol=1e-5, atol=1e-6)
        reloaded = Llama.from_pretrained(out)
        np.testing.assert_allclose(reloaded(it.tensor(x))[0].numpy(), expected, rtol=1e-4, atol=1e-5)


def test_bfloat16_checkpoints_and_hf_sharded_directories_load(tmp_path):
    hf = hf_model(hf_config(tie=True)).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "bf16", max_shard_size="30KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    ours = Llama.from_pretrained(tmp_path / "bf16")
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    widened = hf.float()
    x, _ = batch(3)
    np.testing.assert_allclose(ours(it.tensor(x))[0].numpy(), widened(torch.tensor(x)).logits.detach().numpy(),
                               rtol=1e-4, atol=1e-5)
    ours.save_pretrained(tmp_path / "ours-bf16", dtype="bfloat16")
    config = json.loads((tmp_path / "ours-bf16" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    back = LlamaForCausalLM.from_pretrained(tmp_path / "ours-bf16")
    assert back.model.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(back.model.embed_tokens.weight, hf.model.embed_tokens.weight.to(torch.bfloat16))


@pytest.mark.parametrize("kv", [2, 1])
def test_greedy_generation_with_the_kv_cache_is_token_identical_to_hf(tmp_path, kv):
    hf = hf_model(hf_config(kv=kv), seed=4)
    ours = ours_from(hf, tmp_path)
    prompt = np.array([[5, 17, 42, 8, 3], [9, 9, 1, 60, 2]])
    expected = hf.generate(torch.tensor(prompt), max_new_tokens=30, do_sample=False,
                           attention_mask=torch.ones_like(torch.tensor(prompt))).numpy()
    cached = ours.generate(it.tensor(prompt), 30, temperature=0).numpy()
    uncached = ours.generate(it.tensor(prompt), 30, temperature=0, use_cache=False).numpy()
    assert cached.tolist() == expected.tolist()
    assert uncached.tolist() == expected.tolist()
    cache = ours.new_kv_cache(2, "cpu")
    assert cache.keys[0].shape == (2, kv, ours.config.max_seq_len, ours.config.head_dim)


def test_config_validation_and_load_errors(tmp_path):
    with pytest.raises(ValueError, match=r"n_heads \(6\) must be a multiple of n_kv_heads \(4\)"):
        LlamaConfig(dim=48, n_heads=6, n_kv_heads=4, n_layers=1, vocab_size=10, intermediate_size=8)
    with pytest.raises(ValueError, match="(?s)unknown preset 'llama3.2-1B'; .*did you mean 'llama3.2-1b'"):
        LlamaConfig.from_preset("llama3.2-1B")
    one_b = LlamaConfig.from_preset("llama3.2-1b")
    assert (one_b.dim, one_b.n_layers, one_b.n_heads, one_b.n_kv_heads, one_b.head_dim) == (2048, 16, 32, 8, 64)
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        Llama.from_pretrained(tmp_path)
    hf_model(hf_config()).save_pretrained(tmp_path / "hf")
    text = (tmp_path / "hf" / "config.json").read_text().replace('"hidden_size": 64', '"hidden_size": 32')
    (tmp_path / "hf" / "config.json").write_text(text.replace('"head_dim": 16', '"head_dim": 8'))
    with pytest.raises(WeightsError, match=r"tensor '[a-z_.]+weight' has shape \(97, 64\), expected \(97, 32\)"):
        Llama.from_pretrained(tmp_path / "hf")
    legacy = hf_config().to_dict()
    legacy.pop("rope_parameters")
    legacy.update(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **SCALING})
    assert hf_config_to_llama(legacy, "config.json").rope_scaling == SCALING  # transformers 4's config layout
