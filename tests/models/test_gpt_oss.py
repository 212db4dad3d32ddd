"""gpt-oss against transformers' GptOssForCausalLM on a tiny random model built here (grouped-query attention, sinks,
sliding-window and full layers alternating with a window shorter than the sequences, YaRN, biased router and
clamped-SwiGLU experts with a limit the activations reach): logits, loss (with the load-balancing loss) and every
parameter's gradient in float32 and float64, a right-padded batch (HF's attention mask), greedy generation with the
KV cache, and HF directories both ways.

The float64 comparison runs HF's oracle in float64 throughout: its RMSNorm's cast to float32 is patched out, its
loss is the cross-entropy on its float64 logits (HF's loss upcasts logits to float32 only), and both models use the
same float32 rotary tables (torch's float32 cos / sin differ from NumPy's by an ulp); the load-balancing loss is
compared in float32 (HF sums it in float32)."""
import json

import numpy as np
import pytest
import torch
from transformers import GptOssConfig as HFGptOssConfig
from transformers import GptOssForCausalLM
from transformers.models.gpt_oss import modeling_gpt_oss

import infini_train as it
from infini_train.models.documents import packed_documents
from infini_train.autograd.ops import flash_attention
from infini_train.models.gpt_oss.model import GptOss
from infini_train.nn.attention import SDPBackend, sdpa_kernel

from .hf_lm_checks import batch, check_directories_both_ways, check_generation, shifted_targets

VOCAB = 61
T = 24
PATHS = {"math": SDPBackend.MATH, "blocked": SDPBackend.FLASH_ATTENTION}  # the blocked path in blocks of 8 here


def hf_config(aux=0.25, tie=False, **extra):
    config = HFGptOssConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, sliding_window=5, num_local_experts=4,
        num_experts_per_tok=2, rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0,
                                                    beta_slow=1.0, truncate=False, original_max_position_embeddings=32),
        pad_token_id=0, bos_token_id=None, eos_token_id=None, router_aux_loss_coef=aux, swiglu_limit=1.0,
        tie_word_embeddings=tie, **extra)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    return config


def randomize(hf, seed=0):
    """Weights large enough that the clamp, the sinks and the router's choices all matter."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif "router" in name or "sinks" in name or "bias" in name:
                p.normal_(0.0, 0.5)
            elif "experts" in name:
                p.normal_(0.0, 0.3)
    return hf


def pair(tmp_path, seed=0, dtype=torch.float32, **config):
    hf = randomize(GptOssForCausalLM(hf_config(**config)), seed).to(dtype)
    hf.save_pretrained(tmp_path / "start")
    ours = GptOss.from_pretrained(tmp_path / "start", dtype=it.float64 if dtype == torch.float64 else None)
    return ours, hf


def float64_oracle(monkeypatch, ours, hf):
    """HF's RMSNorm without its float32 cast, and our rotary tables HF's float32 ones."""
    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(modeling_gpt_oss.GptOssRMSNorm, "forward", forward)
    length = ours.config.max_seq_len
    cos, sin = hf.model.rotary_emb(torch.zeros(1), torch.arange(length)[None])
    tables = tuple(np.concatenate([t[0].numpy()] * 2, -1) for t in (cos, sin))
    device = it.backend.Device.parse("cpu")
    ours._rope_tables[device] = tuple(it.backend.to_device_array(t, device) for t in tables)


def compare_gradients(ours, hf, tol):
    grads = {name: p.grad.numpy() if p.grad is not None else np.zeros(p.shape) for name, p in ours.named_parameters()}
    names = {name for name, _ in hf.named_parameters()}
    assert set(grads) == names
    worst = 0.0
    for name, p in hf.named_parameters():
        assert p.grad is not None, name
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=tol, atol=tol, err_msg=name)
        worst = max(worst, float(np.abs(grads[name] - p.grad.numpy()).max()))
    return worst


def test_model_has_hf_structure(tmp_path):
    ours, hf = pair(tmp_path)
    cfg = ours.config
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert [b.self_attn.window for b in ours.model.layers] == [5, None, 5]
    assert cfg.rope_scaling["factor"] == 4.0 and ours._rope_factor > 1.0
    experts = ours.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (4, 32, 48) and experts.down_proj_bias.shape == (4, 32)
    assert ours.model.layers[0].self_attn.sinks.shape == (4,)
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())
    per_expert = 32 * 48 + 48 + 24 * 32 + 32
    assert ours.idle_params(True) == 3 * (4 - 2) * per_expert and ours.idle_params(False) == 0  # MFU: active ones
    active = ours.num_params(non_embedding=True) - ours.idle_params(True)
    attention = 12 * 4 * 8 * (5 + 24 + 5)  # layers 0 and 2 see a window of 5 keys, layer 1 all 24
    assert ours.flops_per_token(24) == 6 * active + attention
    # YaRN: HF's inverse frequencies bit for bit and its attention factor; the tables within an ulp of torch's cos
    rotary = hf.model.rotary_emb
    np.testing.assert_array_equal(ours._inv_freq, rotary.inv_freq.numpy())
    assert ours._rope_factor == rotary.attention_scaling
    cos, sin = rotary(torch.zeros(1), torch.arange(128)[None])
    mine = ours.rope(0, 128, it.backend.Device.parse("cpu"))
    for a, b in zip(mine, (cos, sin)):
        np.testing.assert_allclose(a.numpy()[:, :4], b[0].numpy()[:, :4], rtol=0, atol=3e-7)


def test_float32_logits_loss_aux_loss_and_every_gradient_match_hf(tmp_path):
    ours, hf = pair(tmp_path)
    x = batch(VOCAB, T=T)
    ours.train()
    hf.train()
    logits, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
    out = hf(torch.tensor(x), labels=torch.tensor(x), output_router_logits=True)
    np.testing.assert_allclose(logits.numpy(), out.logits.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.aux_loss.item(), out.aux_loss.item(), rtol=1e-6)
    np.testing.assert_allclose(loss.item(), out.loss.item(), rtol=1e-6)
    loss.backward()
    out.loss.backward()
    compare_gradients(ours, hf, 1e-5)


@pytest.mark.parametrize("path", list(PATHS))
def test_float64_logits_loss_and_every_gradient_match_hf_to_1e_10(tmp_path, monkeypatch, path):
    """Both attention paths: the blocked one with sinks and windows crossing its blocks."""
    monkeypatch.setattr(flash_attention.BlockedAttention, "block", 8)
    ours, hf = pair(tmp_path, dtype=torch.float64, aux=0.0)
    float64_oracle(monkeypatch, ours, hf)
    x = batch(VOCAB, T=T)
    ours.train()
    hf.train()
    with sdpa_kernel(PATHS[path]):
        logits, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
    assert logits.dtype == it.float64
    out = hf(torch.tensor(x))
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB),
                                                 torch.tensor(x[:, 1:]).reshape(-1))
    np.testing.assert_allclose(logits.numpy(), out.logits.detach().numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=0, atol=1e-10)
    loss.backward()
    expected.backward()
    compare_gradients(ours, hf, 1e-10)


@pytest.mark.parametrize("path", list(PATHS))
def test_padded_batch_equals_hf_with_its_attention_mask(tmp_path, monkeypatch, path):
    """One sample per row, right-padded (longer than the window): logits at the samples' positions, the loss over
    their tokens, the load-balancing loss without the padding, and every gradient."""
    monkeypatch.setattr(flash_attention.BlockedAttention, "block", 8)
    ours, hf = pair(tmp_path, seed=1)
    lengths = (9, 14, 6)
    rng = np.random.default_rng(2)
    x = np.zeros((3, 14), np.int64)
    seg, pos = np.zeros_like(x), np.zeros_like(x)
    y = -np.ones_like(x)
    for r, n in enumerate(lengths):
        x[r, :n] = rng.integers(1, VOCAB, n)
        seg[r, :n], pos[r, :n] = 1, np.arange(n)
        y[r, :n - 1] = x[r, 1:n]
    ours.train()
    hf.train()
    with packed_documents(pos, seg), sdpa_kernel(PATHS[path]):
        logits, loss = ours(it.tensor(x), it.tensor(y))
    labels = np.where(seg != 0, x, -100)
    out = hf(torch.tensor(x), attention_mask=torch.tensor(seg), labels=torch.tensor(labels), output_router_logits=True)
    keep = seg != 0
    np.testing.assert_allclose(logits.numpy()[keep], out.logits.detach().numpy()[keep], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.aux_loss.item(), out.aux_loss.item(), rtol=1e-6)
    np.testing.assert_allclose(loss.item(), out.loss.item(), rtol=1e-6)
    loss.backward()
    out.loss.backward()
    compare_gradients(ours, hf, 1e-5)


def test_greedy_generation_with_the_kv_cache_is_token_identical_to_hf(tmp_path):
    ours, hf = pair(tmp_path, seed=3)
    check_generation(ours, hf, VOCAB, new=20)  # 25 positions: well past the window of 5


def test_hf_directories_both_ways(tmp_path):
    ours, hf = pair(tmp_path, seed=4)
    out = check_directories_both_ways(ours, hf, GptOssForCausalLM, GptOss, tmp_path, VOCAB, max_shard_size="20KB")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt_oss" and config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["sliding_window"] == 5


def test_released_config_json_keys_and_refusals(tmp_path):
    """The released checkpoints' config.json (rope_scaling + rope_theta, no swiglu_alpha) maps onto the preset;
    MXFP4-quantised weights are refused with a hint."""
    from infini_train.models.gpt2.io import WeightsError
    from infini_train.models.gpt_oss.config import GptOssConfig

    released = {"model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880, "num_hidden_layers": 24,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 150000,
                "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                 "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
                "sliding_window": 128, "num_local_experts": 32, "num_experts_per_tok": 4, "swiglu_limit": 7.0,
                "router_aux_loss_coef": 0.9, "attention_bias": True, "tie_word_embeddings": False,
                "layer_types": ["sliding_attention", "full_attention"] * 12, "pad_token_id": 199999}
    assert GptOss.config_from_hf(released, "config.json") == GptOssConfig.from_preset("gpt-oss-20b",
                                                                                        pad_token_id=199999)
    with pytest.raises(WeightsError, match="quantized weights .*mxfp4.*\nHINT: dequantize"):
        GptOss.config_from_hf({**released, "quantization_config": {"quant_method": "mxfp4"}}, "config.json")
