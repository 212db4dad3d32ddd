"""Packed and padded batches of documents (SFT samples) against Hugging Face running each sample alone: inside
``packed_documents`` every document's logits are HF's on that document, the loss is HF's summed over the samples'
trained tokens divided by their count (the batch's token mean), and every gradient matches -- for a LLaMA-family
model (rotary positions restarting per document) with and without block recomputation, and GPT-2 (position
embeddings)."""
import numpy as np
import pytest
import torch
import transformers
from transformers import Qwen3ForCausalLM

import infini_train as it
from infini_train.models.documents import DocumentLayout, packed_documents
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama.qwen3 import Qwen3
from infini_train.models.recompute import set_recompute

from .hf_lm_checks import hf_named_grads, randomize
from .test_qwen3 import VOCAB, hf_config

rng = np.random.default_rng(5)
# (token ids, which of them are trained: the "answer" after a prompt) of three samples of different lengths
SAMPLES = [(rng.integers(1, VOCAB, n), np.arange(n) >= p) for n, p in ((7, 3), (5, 2), (9, 4))]


def rows(samples, T, per_row):
    """inputs, targets, positions, segments of rows holding ``per_row[r]`` (sample indices) each, padded with 0."""
    B = len(per_row)
    x, y = np.zeros((B, T), np.int64), -np.ones((B, T), np.int64)
    pos, seg = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
    places = {}
    for r, which in enumerate(per_row):
        at = 0
        for s, i in enumerate(which):
            ids, trained = samples[i]
            n = len(ids)
            x[r, at:at + n], pos[r, at:at + n], seg[r, at:at + n] = ids, np.arange(n), s + 1
            y[r, at:at + n - 1] = np.where(trained[1:], ids[1:], -1)
            places[i] = (r, at, n)
            at += n
    return x, y, pos, seg, places


def hf_reference(hf, samples):
    """(logits per sample, the token-mean loss over every sample's trained next tokens) of HF on each alone."""
    logits, total, count = [], 0.0, 0
    for ids, trained in samples:
        out = hf(torch.tensor(ids[None]))
        logits.append(out.logits[0])
        labels = torch.tensor(np.where(trained[1:], ids[1:], -100))
        total = total + torch.nn.functional.cross_entropy(out.logits[0, :-1], labels, ignore_index=-100,
                                                          reduction="sum")
        count += int(trained[1:].sum())
    return logits, total / count


def qwen3_pair(tmp_path):
    hf = randomize(Qwen3ForCausalLM(hf_config()), 0)
    hf.save_pretrained(tmp_path / "start")
    return Qwen3.from_pretrained(tmp_path / "start"), hf


@pytest.mark.parametrize("recompute", ["none", "block"])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_llama_family_documents_equal_hf_one_by_one(tmp_path, layout, recompute):
    ours, hf = qwen3_pair(tmp_path)
    set_recompute(ours, recompute)
    per_row = [[0, 1], [2]] if layout == "packed" else [[0], [1], [2]]
    x, y, pos, seg, places = rows(SAMPLES, 16 if layout == "packed" else 10, per_row)
    ours.train()
    with packed_documents(pos, seg):
        logits, loss = ours(it.tensor(x), it.tensor(y))
    hf_logits, hf_loss = hf_reference(hf, SAMPLES)
    for i, (r, at, n) in places.items():
        np.testing.assert_allclose(logits.numpy()[r, at:at + n], hf_logits[i].detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss.item(), hf_loss.item(), rtol=1e-5)
    loss.backward()
    hf_loss.backward()
    grads = hf_named_grads(ours)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_without_the_layout_documents_see_each_other(tmp_path):
    """The control: the same packed row run as one causal sequence differs from HF's per-sample logits."""
    ours, hf = qwen3_pair(tmp_path)
    x, y, pos, seg, places = rows(SAMPLES, 16, [[0, 1], [2]])
    logits, _ = ours(it.tensor(x), it.tensor(y))
    r, at, n = places[1]  # the second document of row 0
    hf_logits, _ = hf_reference(hf, SAMPLES)
    assert np.abs(logits.numpy()[r, at:at + n] - hf_logits[1].detach().numpy()).max() > 1e-2


def test_gpt2_position_embeddings_restart_per_document(tmp_path):
    it.manual_seed(0)
    ours = GPT2(GPT2Config(block_size=32, vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=32))
    ours.save_pretrained(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    ours.eval()
    x, y, pos, seg, places = rows(SAMPLES, 16, [[0, 1], [2]])
    with packed_documents(DocumentLayout(pos, seg)):
        logits, loss = ours(it.tensor(x), it.tensor(y))
    hf_logits, hf_loss = hf_reference(hf, SAMPLES)
    for i, (r, at, n) in places.items():
        np.testing.assert_allclose(logits.numpy()[r, at:at + n], hf_logits[i].detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss.item(), hf_loss.item(), rtol=1e-5)


def test_layout_errors(tmp_path):
    ours, _ = qwen3_pair(tmp_path)
    x, y, pos, seg, _ = rows(SAMPLES, 16, [[0, 1], [2]])
    with pytest.raises(ValueError, match=r"the packed documents' layout is \(2, 16\), the tokens are \(1, 16\)"):
        with packed_documents(pos, seg):
            ours(it.tensor(x[:1]))
    with pytest.raises(ValueError, match="expected positions and segments of the same"):
        DocumentLayout(pos, seg[:, :4])
    with pytest.raises(ValueError, match="without a KV cache"):
        with packed_documents(pos, seg):
            ours(it.tensor(x), kv_cache=ours.new_kv_cache(2, it.backend.CPU))


def test_moe_padded_batch_counts_no_padding_in_the_load_balancing_loss(tmp_path):
    """Qwen3-MoE on one sample per row, right-padded: HF with the attention mask (its load-balancing loss leaves the
    masked positions out) gives our loss, auxiliary loss and every gradient."""
    from transformers import Qwen3MoeForCausalLM

    from infini_train.models.llama.qwen3_moe import Qwen3Moe

    from .hf_lm_checks import randomize as randomize_moe
    from .test_moe_models import VOCAB as MOE_VOCAB
    from .test_moe_models import qwen3_moe_config

    hf = randomize_moe(Qwen3MoeForCausalLM(qwen3_moe_config()), 0)
    hf.save_pretrained(tmp_path / "moe")
    ours = Qwen3Moe.from_pretrained(tmp_path / "moe")
    samples = [(ids % MOE_VOCAB, trained) for ids, trained in SAMPLES]
    assert any((ids == 0).any() for ids, _ in samples)  # config.json's pad_token_id 0 as a real token: no gradient
    assert ours.model.embed_tokens.padding_idx == 0
    x, y, pos, seg, _ = rows(samples, 10, [[0], [1], [2]])
    ours.train()
    with packed_documents(pos, seg):
        _, loss = ours(it.tensor(x), it.tensor(y))
    hf.train()
    labels = np.full_like(x, -100)
    labels[:, 1:] = np.where(y[:, :-1] != -1, y[:, :-1], -100)  # HF shifts its labels itself
    out = hf(torch.tensor(x), attention_mask=torch.tensor((seg != 0).astype(np.int64)), labels=torch.tensor(labels),
             output_router_logits=True)
    np.testing.assert_allclose(ours.aux_loss.item(), out.aux_loss.item(), rtol=1e-5)
    np.testing.assert_allclose(loss.item(), out.loss.item(), rtol=1e-5)
    loss.backward()
    out.loss.backward()
    grads = hf_named_grads(ours)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
