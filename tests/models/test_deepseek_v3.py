"""DeepSeek-V3 (models/deepseek_v3/) against HF's DeepseekV3ForCausalLM on tiny random models: logits, loss and every
gradient (float64 with HF's float32 casts taken out: 1e-10; float32 as HF runs: 1e-5), with and without q_lora_rank,
dense and DeepSeek-MoE layers, a padded batch; greedy generation with the compressed cache; the cache's bytes."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.documents import packed_documents
from infini_train.models.deepseek_v3.mla_cache import MLACache, cache_bytes_per_token

from .deepseek_v3_setup import VOCAB, batch, grads_by_hf_name, hf_float64, pair, shifted_targets


def compare(ours, hf, x, atol, rtol, labels=None, mask=None, layout=None):
    """Logits, loss and every gradient (HF's names); returns the largest errors."""
    ours.train()
    hf.train()
    targets = shifted_targets(x) if labels is None else np.concatenate(
        [labels[:, 1:], -np.ones((x.shape[0], 1), np.int64)], 1)
    targets = np.where(targets == -100, -1, targets)
    with packed_documents(*layout) if layout else packed_documents(None):
        logits, loss = ours(it.tensor(x), it.tensor(targets))
    hf_labels = torch.tensor(x if labels is None else labels)
    out = hf(torch.tensor(x), attention_mask=None if mask is None else torch.tensor(mask))
    # HF's loss (ForCausalLMLoss: labels shifted inside), in the logits' dtype (HF's own upcasts to float32 only)
    out.loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
                                                 hf_labels[:, 1:].reshape(-1), ignore_index=-100)
    keep = np.ones(x.shape, bool) if mask is None else mask.astype(bool)
    errors = {"logits": np.abs(logits.numpy() - out.logits.detach().numpy())[keep].max(),
              "loss": abs(loss.item() - out.loss.item())}
    np.testing.assert_allclose(logits.numpy()[keep], out.logits.detach().numpy()[keep], rtol=rtol, atol=atol)
    np.testing.assert_allclose(loss.item(), out.loss.item(), rtol=rtol, atol=atol)
    loss.backward()
    out.loss.backward()
    ours_grads = grads_by_hf_name(ours)
    hf_names = {name for name, _ in hf.named_parameters()}
    assert set(ours_grads) == hf_names
    worst = 0.0
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(ours_grads[name], p.grad.numpy(), rtol=rtol, atol=atol, err_msg=name)
        worst = max(worst, np.abs(ours_grads[name] - p.grad.numpy()).max())
    errors["grads"] = worst
    return errors


CASES = {"q_lora": dict(q_lora_rank=24), "direct_q": dict(q_lora_rank=None),
         "halves_no_yarn": dict(q_lora_rank=24, interleave=False, yarn=False), "all_dense": dict(dense=3),
         "biases_pad_tied": dict(q_lora_rank=24, attention_bias=True, pad_token_id=3, tie_word_embeddings=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_float64_logits_loss_and_every_gradient_equal_hf(tmp_path, case):
    ours, hf = pair(tmp_path, **CASES[case])
    x = batch()
    with hf_float64(ours, hf, x.shape[1]):
        errors = compare(ours, hf, x, atol=1e-10, rtol=1e-10)
    print(case, errors)


@pytest.mark.parametrize("case", ["q_lora", "direct_q"])
def test_float32_logits_loss_and_every_gradient_equal_hf(tmp_path, case):
    ours, hf = pair(tmp_path, seed=3, **CASES[case])
    errors = compare(ours, hf, batch(seed=4), atol=1e-5, rtol=1e-5)
    print(case, errors)


def test_padded_batch_equals_hf_with_its_attention_mask(tmp_path):
    """Right-padded rows: ours under packed_documents (one sample per row), HF with the attention mask; the padding's
    labels ignored by both."""
    ours, hf = pair(tmp_path, seed=5)
    x = batch(seed=6, B=3, T=14)
    lengths = [14, 9, 5]
    mask = (np.arange(14)[None] < np.array(lengths)[:, None]).astype(np.int64)
    labels = np.where(mask.astype(bool), x, -100)
    positions = np.where(mask.astype(bool), np.arange(14)[None], 0)
    with hf_float64(ours, hf, 14):
        errors = compare(ours, hf, x, 1e-10, 1e-10, labels=labels, mask=mask, layout=(positions, mask))
    print("padded", errors)


@pytest.mark.parametrize("case", ["q_lora", "direct_q"])
def test_greedy_generation_with_the_compressed_cache_equals_hf(tmp_path, case):
    ours, hf = pair(tmp_path, seed=7, **CASES[case])
    prompt = np.array([[5, 17, 42, 8, 3], [9, 9, 1, 30, 2]]) % VOCAB
    hf.generation_config.eos_token_id = None  # (config.json's eos 1 would end HF's rows early)
    expected = hf.generate(torch.tensor(prompt), max_new_tokens=20, do_sample=False,
                           attention_mask=torch.ones_like(torch.tensor(prompt))).numpy()
    cached = ours.generate(it.tensor(prompt), 20, temperature=0).numpy()
    uncached = ours.generate(it.tensor(prompt), 20, temperature=0, use_cache=False).numpy()
    assert cached.tolist() == expected.tolist()
    assert uncached.tolist() == expected.tolist()


def test_the_cache_keeps_the_latent_and_the_rope_key(tmp_path):
    ours, _ = pair(tmp_path, seed=8)
    cfg = ours.config
    cache = ours.new_kv_cache(2, it.backend.CPU)
    assert isinstance(cache, MLACache)
    x = batch(seed=9, T=6)
    with it.no_grad():
        whole = ours(it.tensor(x))[0].numpy()
        ours(it.tensor(x[:, :4]), kv_cache=cache)
        step = ours(it.tensor(x[:, 4:]), kv_cache=cache)[0].numpy()
    np.testing.assert_allclose(step, whole[:, 4:], atol=1e-5)
    assert cache.length == 6
    assert cache.latents[0].shape == (2, cfg.max_seq_len, cfg.kv_lora_rank)
    assert cache.rope_keys[0].shape == (2, 1, cfg.max_seq_len, cfg.qk_rope_head_dim)
    per_token = cache_bytes_per_token(cfg)
    assert cache.nbytes() == per_token["mla"] * 2 * cfg.max_seq_len


def test_cache_bytes_per_token_against_an_equal_width_llama():
    from infini_train.models.deepseek_v3.config import DeepseekV3Config

    full = cache_bytes_per_token(DeepseekV3Config.from_preset("deepseek-v3"), np.dtype("bfloat16")
                                 if hasattr(np, "bfloat16") else np.float16)
    assert full["mla"] == 61 * (512 + 64) * 2  # 70,272 bytes per token
    assert full["llama"] == 61 * 2 * 7168 * 2  # 1,748,992: 128 heads of 56 keys and values
    assert full["ratio"] == pytest.approx(24.89, abs=0.01)
    tiny = cache_bytes_per_token(DeepseekV3Config.from_preset("deepseek-v3-tiny"))
    assert tiny == {"mla": 4 * 32 * 4, "llama": 4 * 2 * 64 * 4, "ratio": 4.0}


def test_the_memory_efficient_attention_gives_the_materialised_one(tmp_path):
    """MLA's keys (nope + rope) are wider than its values: the blocked kernel takes them, with DeepSeek's scale, for
    the forward, every gradient and a cached continuation."""
    from infini_train.nn.attention import SDPBackend, sdpa_kernel

    ours, _ = pair(tmp_path, seed=15)
    x = batch(seed=16)
    results = []
    for backend in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION):
        ours.zero_grad()
        with sdpa_kernel(backend):
            logits, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
            loss.backward()
            generated = ours.generate(it.tensor(x[:, :5]), 6, temperature=0).numpy()
        results.append((logits.numpy(), {n: p.grad.numpy().copy() for n, p in ours.named_parameters()}, generated))
    (math_logits, math_grads, math_gen), (blocked_logits, blocked_grads, blocked_gen) = results
    np.testing.assert_allclose(blocked_logits, math_logits, rtol=1e-5, atol=1e-6)
    for name, g in math_grads.items():
        np.testing.assert_allclose(blocked_grads[name], g, rtol=1e-4, atol=1e-6, err_msg=name)
    assert blocked_gen.tolist() == math_gen.tolist()


@pytest.mark.parametrize("case", ["q_lora", "direct_q"])
def test_absorbed_decoding_gives_the_expanded_attention(tmp_path, case):
    """Weight absorption over the compressed cache: the logits of a cached continuation within rounding, and the
    greedy tokens HF's generate gives."""
    ours, hf = pair(tmp_path, seed=17, **CASES[case])
    x = batch(seed=18, T=9)
    expanded = ours.new_kv_cache(2, it.backend.CPU)
    ours.absorbed_decoding = True
    absorbed = ours.new_kv_cache(2, it.backend.CPU)
    with it.no_grad():
        for cache in (expanded, absorbed):
            ours(it.tensor(x[:, :5]), kv_cache=cache)
        a = ours(it.tensor(x[:, 5:]), kv_cache=expanded)[0].numpy()
        b = ours(it.tensor(x[:, 5:]), kv_cache=absorbed)[0].numpy()
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    prompt = np.array([[5, 17, 42, 8, 3], [9, 9, 1, 30, 2]]) % VOCAB
    hf.generation_config.eos_token_id = None
    expected = hf.generate(torch.tensor(prompt), max_new_tokens=20, do_sample=False,
                           attention_mask=torch.ones_like(torch.tensor(prompt))).numpy()
    assert ours.generate(it.tensor(prompt), 20, temperature=0).numpy().tolist() == expected.tolist()
