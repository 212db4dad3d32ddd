"""MoECausalLM with DeepSeek-MoE layers (a config with ``seq_aux_loss_alpha``): the loss is cross-entropy plus alpha
times the sum of the layers' sequence-wise balance losses (no Switch loss), ``aux_loss`` holds that sum, the router
statistics passed between pipeline chunks carry it in one more entry, and alpha 0 adds nothing; MoEMetrics logs the
correction biases' summary. A Qwen3-MoE shell whose sparse MLPs are DeepSeekMoE layers stands in for the model."""
from types import SimpleNamespace

import numpy as np
import pytest

import infini_train as it
from infini_train.models.llama.qwen3_moe import Qwen3Moe, Qwen3MoeConfig
from infini_train.nn.moe_routing import DeepSeekMoE
from infini_train.training.moe_metrics import MoEMetrics


def model(alpha):
    it.manual_seed(0)
    cfg = Qwen3MoeConfig(dim=16, n_layers=3, n_heads=2, n_kv_heads=1, head_dim=8, intermediate_size=24,
                         vocab_size=31, max_seq_len=16, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=8, mlp_only_layers=[0])
    cfg.seq_aux_loss_alpha = alpha  # (the DeepSeek-V3 config's field)
    m = Qwen3Moe(cfg)
    for layer, block in m.numbered_blocks():
        if cfg.sparse_layer(layer):
            block.mlp = DeepSeekMoE(16, 8, 4, 2, n_group=2, topk_group=1, seq_aux_loss_alpha=alpha)
            block.mlp.gate.e_score_correction_bias.copy_(it.tensor(np.array([0.01, 0, -0.02, 0], np.float32)))
    return m


def batch():
    rng = np.random.default_rng(0)
    return it.tensor(rng.integers(0, 31, (2, 8))), it.tensor(rng.integers(0, 31, (2, 8)))


@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_loss_adds_the_sequence_balance_losses(alpha):
    x, y = batch()
    m = model(alpha)
    _, loss = m(x, y)
    logits, _ = m(x)
    ce = it.nn.functional.cross_entropy(logits.reshape(-1, 31), y.reshape(-1)).item()
    layers = m.moe_layers()
    assert len(layers) == 2
    if alpha:
        seq = sum(layer.seq_aux_loss.item() for layer in layers)
        np.testing.assert_allclose(m.aux_loss.item(), seq, rtol=1e-6)
        np.testing.assert_allclose(loss.item(), ce + alpha * seq, rtol=1e-6)
        stats = m.router_statistics()
        assert stats.shape == (2 * 4 + 2,) and m.pipeline_extras(it.float32)[0][0] == (10,)
        np.testing.assert_allclose(stats[-1].item(), seq, rtol=1e-6)
        loss.backward()
        assert all(layer.gate.weight.grad is not None for layer in layers)
    else:
        assert m.aux_loss is None and m.pipeline_extras(it.float32)[0][0] == (9,)
        np.testing.assert_allclose(loss.item(), ce, rtol=1e-6)


def test_metrics_log_the_correction_biases():
    m = model(0.0)
    metrics = MoEMetrics([m], SimpleNamespace(world=1))
    x, y = batch()
    m(x, y)
    record = metrics.collect()
    assert record["correction_bias_absmax"] == pytest.approx(0.02)
    assert record["correction_bias_mean_abs"] == pytest.approx(0.0075)
    assert record["aux_loss"] == 0.0 and record["experts_idle"] >= 0
