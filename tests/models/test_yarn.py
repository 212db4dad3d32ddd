"""models/yarn.py against transformers' own YaRN: the inverse frequencies and attention factor of
``_compute_yarn_parameters``, the rotary tables the DeepSeek-V3 rotary embedding builds from them, and DeepSeek's
softmax scale (``yarn_apply_mscale``)."""
import numpy as np
import pytest
import torch

from infini_train.models.yarn import attention_factor, deepseek_softmax_scale, get_mscale, yarn_parameters

CASES = [
    dict(factor=40.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    dict(factor=4.0, original_max_position_embeddings=128, beta_fast=32, beta_slow=1, mscale=0.707,
         mscale_all_dim=1.0),
    dict(factor=8.0, original_max_position_embeddings=32),  # defaults: betas 32 / 1, attention factor mscale(8)
    dict(factor=2.0, original_max_position_embeddings=256, beta_fast=16, beta_slow=2, truncate=False),
    dict(factor=4.0, original_max_position_embeddings=64, attention_factor=1.3),
    dict(factor=None, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.5),  # factor from contexts
]


def hf_config(params, dim=16, theta=10000.0, context=512):
    from transformers import DeepseekV3Config

    rope = {"rope_type": "yarn", "rope_theta": theta, **params}
    return DeepseekV3Config(vocab_size=32, hidden_size=32, num_attention_heads=2, qk_rope_head_dim=dim,
                            qk_nope_head_dim=8, max_position_embeddings=context, rope_parameters=rope)


@pytest.mark.parametrize("params", CASES, ids=range(len(CASES)))
@pytest.mark.parametrize("dim,theta", [(16, 10000.0), (64, 500000.0), (8, 10000.0)])
def test_inv_freq_and_attention_factor_equal_hf(params, dim, theta):
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    config = hf_config(params, dim, theta)
    expected, expected_factor = _compute_yarn_parameters(config)
    inv, factor = yarn_parameters(dim, theta, params, max_position_embeddings=512)
    assert inv.dtype == np.float32 and inv.shape == (dim // 2,)
    np.testing.assert_array_equal(inv, expected.numpy())
    assert factor == expected_factor


def test_rotary_tables_equal_hf_rotary_embedding_in_float64():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    params = CASES[1]
    hf = DeepseekV3RotaryEmbedding(hf_config(params))
    positions = torch.arange(40)[None]
    cos, sin = hf(torch.zeros(1, dtype=torch.float64), positions)
    inv, factor = yarn_parameters(16, 10000.0, params, 512)
    freqs = np.arange(40, dtype=np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], -1)
    ours_cos = (np.cos(emb) * np.float32(factor)).astype(np.float64)
    ours_sin = (np.sin(emb) * np.float32(factor)).astype(np.float64)
    np.testing.assert_allclose(ours_cos, cos[0].numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours_sin, sin[0].numpy(), rtol=0, atol=1e-6)


def test_deepseek_softmax_scale_equals_hf():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    for params in CASES[:2] + [dict(factor=40.0, mscale_all_dim=0.0), dict(factor=1.0, mscale_all_dim=1.0)]:
        rope = {"rope_type": "yarn", **params}
        assert deepseek_softmax_scale(24, params) == yarn_apply_mscale(rope, 24 ** -0.5)
    assert deepseek_softmax_scale(24, None) == 24 ** -0.5
    assert get_mscale(1.0) == 1.0 and get_mscale(40.0, 1.0) == pytest.approx(1 + 0.1 * np.log(40.0))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        attention_factor({"factor": None, "original_max_position_embeddings": 64})
