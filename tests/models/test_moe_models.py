"""Qwen3-MoE and Mixtral against transformers' Qwen3MoeForCausalLM and MixtralForCausalLM on small random configs with
grouped-query attention (Qwen3-MoE mixing dense and sparse layers): logits, HF's loss with the auxiliary
load-balancing loss (one loss over all layers' router logits), every gradient (HF's fused expert tensors), greedy
generation with the KV cache, and HF directories both ways (Mixtral's block_sparse_moe / w1 w3 w2 names)."""
import json

import numpy as np
import pytest
from safetensors import safe_open
from transformers import MixtralConfig as HFMixtralConfig
from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM
from transformers import Qwen3MoeConfig as HFQwen3MoeConfig

import infini_train as it
from infini_train import nn
from infini_train.models.llama.mixtral import Mixtral, MixtralConfig
from infini_train.models.moe_lm import load_balancing_loss_over_layers
from infini_train.models.llama.qwen3_moe import Qwen3Moe, Qwen3MoeConfig
from infini_train.models.registry import model_spec, spec_of

from .hf_lm_checks import batch, check_directories_both_ways, check_forward_backward, check_generation, randomize

VOCAB = 61
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=0,
              router_aux_loss_coef=0.25)


def qwen3_moe_config(norm=True, tie=False):
    """4 layers: 0 dense (mlp_only_layers), 1 sparse, 2 dense (decoder_sparse_step 2 skips it), 3 sparse."""
    return HFQwen3MoeConfig(**COMMON, num_hidden_layers=4, head_dim=16, moe_intermediate_size=12, num_experts=6,
                            num_experts_per_tok=2, norm_topk_prob=norm, decoder_sparse_step=2, mlp_only_layers=[0],
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=tie)


def mixtral_config():
    return HFMixtralConfig(**COMMON, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def pair(tmp_path, hf_class, config, our_class, seed=0):
    hf = randomize(hf_class(config), seed)
    hf.save_pretrained(tmp_path / "start")
    return our_class.from_pretrained(tmp_path / "start"), hf


@pytest.mark.parametrize("norm,tie", [(True, False), (False, True)], ids=["norm-topk", "unnormalised-tied"])
def test_qwen3_moe_logits_loss_aux_loss_and_every_gradient_match_hf(tmp_path, norm, tie):
    ours, hf = pair(tmp_path, Qwen3MoeForCausalLM, qwen3_moe_config(norm, tie), Qwen3Moe)
    layers = ours.model.layers
    assert [isinstance(b.mlp, nn.MoE) for b in layers] == [False, True, False, True]
    assert layers[1].mlp.experts[0].up_proj.weight.shape == (12, 32) and layers[0].mlp.up_proj.weight.shape == (40, 32)
    assert ours.config.norm_topk_prob == norm and ours.config.router_aux_loss_coef == 0.25
    loss, out = check_forward_backward(ours, hf, VOCAB, moe=True)
    assert len(out.router_logits) == 2  # HF's aux loss reads the sparse layers only, as ours
    per_layer_mean = np.mean([m.aux_loss.item() for m in ours.moe_layers()])
    assert abs(per_layer_mean - ours.aux_loss.item()) > 1e-6  # one loss over all layers' rows, not a mean of losses


def test_mixtral_logits_loss_aux_loss_and_every_gradient_match_hf(tmp_path):
    ours, hf = pair(tmp_path, MixtralForCausalLM, mixtral_config(), Mixtral)
    assert all(isinstance(b.mlp, nn.MoE) for b in ours.model.layers) and ours.config.num_experts == 4
    assert ours.model.layers[0].mlp.gate.norm_topk_prob is True
    check_forward_backward(ours, hf, VOCAB, moe=True)


def test_aux_loss_is_hf_load_balancing_loss_over_concatenated_layers():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    import torch

    rng = np.random.default_rng(3)
    logits = [rng.normal(size=(10, 5)).astype(np.float32) for _ in range(3)]
    probs = [nn.functional.softmax(it.tensor(a), dim=-1) for a in logits]  # what each layer's router computed
    counts = [np.bincount(p.topk(2, dim=-1)[1].numpy().reshape(-1), minlength=5) for p in probs]
    ours = load_balancing_loss_over_layers(probs, counts)
    expected = load_balancing_loss_func(tuple(torch.tensor(a) for a in logits), 5, 2)
    np.testing.assert_allclose(ours.item(), expected.item(), rtol=1e-6)


@pytest.mark.parametrize("which", ["qwen3_moe", "mixtral"])
def test_greedy_generation_with_the_kv_cache_is_token_identical_to_hf(tmp_path, which):
    if which == "mixtral":
        ours, hf = pair(tmp_path, MixtralForCausalLM, mixtral_config(), Mixtral, seed=4)
    else:
        ours, hf = pair(tmp_path, Qwen3MoeForCausalLM, qwen3_moe_config(), Qwen3Moe, seed=4)
    check_generation(ours, hf, VOCAB)


def test_qwen3_moe_directories_both_ways(tmp_path):
    ours, hf = pair(tmp_path, Qwen3MoeForCausalLM, qwen3_moe_config(), Qwen3Moe, seed=5)
    out = check_directories_both_ways(ours, hf, Qwen3MoeForCausalLM, Qwen3Moe, tmp_path, VOCAB,
                                      max_shard_size="40KB")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_experts"], config["mlp_only_layers"]) == ("qwen3_moe", 6, [0])
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.3.mlp.experts.5.down_proj.weight" in index and "model.layers.1.mlp.gate.weight" in index


def test_mixtral_directories_both_ways_with_block_sparse_moe_names(tmp_path):
    ours, hf = pair(tmp_path, MixtralForCausalLM, mixtral_config(), Mixtral, seed=6)
    out = check_directories_both_ways(ours, hf, MixtralForCausalLM, Mixtral, tmp_path, VOCAB)
    with safe_open(out / "model.safetensors", "np") as f:
        names = set(f.keys())
        np.testing.assert_array_equal(f.get_tensor("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
                                      ours.model.layers[1].mlp.experts[2].up_proj.weight.numpy())
    with safe_open(tmp_path / "hf" / "model.safetensors", "np") as f:
        assert names == set(f.keys())  # the names HF writes, exactly
    assert not any(".mlp." in n for n in names)
    assert json.loads((out / "config.json").read_text())["num_local_experts"] == 4


def test_specs_take_model_parallel_layouts_and_refuse_recompute():
    cfg = Qwen3MoeConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                         intermediate_size=40, moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                         max_seq_len=32)
    model = Qwen3Moe(cfg)
    assert spec_of(model).arch == "qwen3_moe" and model_spec("mixtral").model_class is Mixtral
    # stages pass the router statistics on; the attention splits, the experts stay whole on the tensor ranks
    assert spec_of(model).validate(cfg, tensor=2, pipeline=2) == []
    assert spec_of(model).validate(cfg, tensor=4)[0].startswith("parallel.tensor: expected a divisor of model "
                                                                "n_kv_head (2")
    with pytest.raises(ValueError, match="Qwen3Moe under tensor parallelism needs parallel.sequence=true"):
        spec_of(model).tensor_parallel(model, type("Group", (), {"size": 2})(), False)
    model.recompute = "block"
    x = it.tensor(batch(VOCAB, T=8))
    with pytest.raises(NotImplementedError, match="train.recompute=block: not supported for Qwen3Moe"):
        model(x, x)
    with pytest.raises(ValueError, match="num_experts_per_tok: expected at most num_experts"):
        MixtralConfig(vocab_size=10, dim=8, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=8,
                      num_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match="no layer is sparse"):
        Qwen3MoeConfig(**{**cfg.to_dict(), "mlp_only_layers": [0, 1]})
    assert Qwen3MoeConfig(**cfg.to_dict()) == cfg
