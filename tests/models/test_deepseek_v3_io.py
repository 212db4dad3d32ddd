"""DeepSeek-V3's HF directories both ways (it.models.from_pretrained of HF's save_pretrained, our save_pretrained
loaded by transformers, equal logits), its config.json mapping, the multi-token prediction layers skipped on reading,
the run-config section and the FLOP count (MLA's attention, the active experts only)."""
import json

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.deepseek_v3.config import DeepseekV3Config
from infini_train.models.deepseek_v3.io import deepseek_v3_to_hf_config, hf_config_to_deepseek_v3
from infini_train.models.deepseek_v3.model import DeepseekV3
from infini_train.safetensors_io import mapped_safetensors, write_safetensors

from .deepseek_v3_setup import batch, hf_config, pair


@pytest.mark.parametrize("q_lora_rank", [24, None], ids=["q_lora", "direct_q"])
def test_hf_directories_both_ways(tmp_path, q_lora_rank):
    from transformers import DeepseekV3ForCausalLM

    _, hf = pair(tmp_path, seed=11, q_lora_rank=q_lora_rank)
    x = batch(seed=12)
    expected = hf(torch.tensor(x)).logits.detach().numpy()
    loaded = it.models.from_pretrained(tmp_path / "hf11")
    assert type(loaded) is DeepseekV3
    np.testing.assert_allclose(loaded(it.tensor(x))[0].numpy(), expected, rtol=1e-5, atol=1e-5)
    bias = loaded.model.layers[1].mlp.gate.e_score_correction_bias.numpy()
    np.testing.assert_array_equal(bias, hf.model.layers[1].mlp.gate.e_score_correction_bias.numpy())
    loaded.save_pretrained(tmp_path / "ours", max_shard_size="40KB")
    assert (tmp_path / "ours" / "model.safetensors.index.json").exists()
    again = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "ours", experts_implementation="eager").eval()
    np.testing.assert_allclose(again(torch.tensor(x)).logits.detach().numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(again.model.layers[1].mlp.gate.e_score_correction_bias.numpy(), bias)
    back = it.models.from_pretrained(tmp_path / "ours")
    assert back.config == loaded.config


def test_config_json_both_ways_and_the_released_layout():
    hf = hf_config(q_lora_rank=None).to_dict()
    ours = hf_config_to_deepseek_v3(hf, "config.json")
    assert ours.q_lora_rank is None and ours.rope_scaling["factor"] == 4.0 and ours.n_heads == 4
    assert hf_config_to_deepseek_v3(deepseek_v3_to_hf_config(ours, "float32"), "x") == ours
    released = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
                "vocab_size": 129280, "intermediate_size": 18432, "max_position_embeddings": 163840,
                "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                                                      "mscale": 1.0, "mscale_all_dim": 1.0,
                                                      "original_max_position_embeddings": 4096},
                "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
                "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "routed_scaling_factor": 2.5,
                "num_nextn_predict_layers": 1, "tie_word_embeddings": False}
    full = hf_config_to_deepseek_v3(released, "config.json")
    assert full == DeepseekV3Config.from_preset("deepseek-v3", max_seq_len=163840, num_nextn_predict_layers=1)
    with pytest.raises(Exception, match="rope scaling 'dynamic' is not supported"):
        hf_config_to_deepseek_v3({**released, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "config.json")


def test_a_directory_without_the_multi_token_prediction_weights_reads_without_them(tmp_path):
    """transformers writes num_nextn_predict_layers = 1 (its default) and no MTP tensors; tensors of layer N without
    an MTP module's eh_proj are skipped (test_deepseek_v3_mtp.py reads whole MTP modules)."""
    ours, _ = pair(tmp_path, seed=13)
    directory = tmp_path / "hf13"
    tensors = mapped_safetensors(str(directory / "model.safetensors"))
    state = {k: np.asarray(v) for k, v in tensors.items()}
    state["model.layers.3.self_attn.kv_b_proj.weight"] = np.zeros((88, 16), np.float32)
    write_safetensors(str(directory / "model.safetensors"), state, {"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1
    loaded = it.models.from_pretrained(directory)
    assert loaded.config.num_nextn_predict_layers == 0 and "mtp" not in loaded._modules
    x = batch(seed=14)
    np.testing.assert_array_equal(loaded(it.tensor(x))[0].numpy(), ours(it.tensor(x))[0].numpy())


def test_flops_count_mla_attention_and_the_active_experts_only():
    cfg = DeepseekV3Config.from_preset("deepseek-v3-tiny")
    model = DeepseekV3(cfg)
    T = 64
    expert = 3 * cfg.dim * cfg.moe_intermediate_size
    sparse = cfg.n_layers - cfg.first_k_dense_replace
    active = (model.num_params(non_embedding=True) - sparse * (cfg.n_routed_experts - cfg.num_experts_per_tok)
              * expert)
    attention = 6 * cfg.n_layers * cfg.n_heads * T * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim)
    assert model.flops_per_token(T) == 6 * active + attention
    full = DeepseekV3Config.from_preset("deepseek-v3")  # 37B active of 671B: the counts from the config alone
    assert full.num_experts == 256 and full.head_dim == 192


def test_run_config_section_builds_the_tiny_config():
    from infini_train.models import registry
    from infini_train.training.config import ConfigError, load_config

    cfg = load_config("configs/deepseek_v3_tiny.yaml", [])
    built = registry.section("deepseek_v3").model_config(cfg.model)
    assert built.q_lora_rank == 64 and built.kv_lora_rank == 32 and built.rope_scaling["factor"] == 4.0
    assert built.sparse_layer(1) and not built.sparse_layer(0) and built.n_routed_experts == 8
    direct = registry.section("deepseek_v3").model_config(load_config("configs/deepseek_v3_tiny.yaml",
                                                                      ["model.q_lora_rank=0",
                                                                       "model.rope_scaling_factor=0"]).model)
    assert direct.q_lora_rank is None and direct.rope_scaling is None
    with pytest.raises(ConfigError, match=r"model.first_k_dense_replace: expected first_k_dense_replace \(4\)"):
        load_config("configs/deepseek_v3_tiny.yaml", ["model.first_k_dense_replace=4"])
