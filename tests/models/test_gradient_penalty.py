"""Gradient penalties through real models, against torch 2.13: an input-gradient penalty through a whole GPT-2 block
(Hugging Face's GPT2Block with the same weights, float64) with its gradients for every block parameter, and a
WGAN-GP step for a small convolutional critic (conv, max/avg pooling, layer norm, linear) on interpolates."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config

transformers = pytest.importorskip("transformers")


def test_input_gradient_penalty_through_a_gpt2_block_matches_hf(tmp_path):
    it.manual_seed(0)
    ours = GPT2(GPT2Config(block_size=16, vocab_size=64, n_layer=1, n_head=4, n_embd=32)).double()
    ours.save_pretrained(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").double()
    hf.eval(), ours.eval()
    block, hf_block = ours.transformer.h[0], hf.transformer.h[0]
    rng = np.random.default_rng(0)
    x_array, v_array = rng.standard_normal((2, 7, 32)), rng.standard_normal((2, 7, 32))

    def penalty(m, blk, call):
        x = m.tensor(x_array, requires_grad=True)
        out = call(blk, x)
        (g,) = m.autograd.grad((out * m.tensor(v_array)).sum(), x, create_graph=True)
        value = (g * g).sum()
        value.backward()
        return value, g

    p_ours, g_ours = penalty(it, block, lambda b, x: b(x))
    causal = torch.full((7, 7), float("-inf"), dtype=torch.float64).triu(1)[None, None]  # the model level's mask
    p_hf, g_hf = penalty(torch, hf_block, lambda b, x: _first(b(x, attention_mask=causal)))
    np.testing.assert_allclose(p_ours.item(), p_hf.item(), rtol=1e-10)
    np.testing.assert_allclose(g_ours.detach().numpy(), g_hf.detach().numpy(), rtol=1e-9, atol=1e-12)
    theirs = dict(hf_block.named_parameters())
    checked = 0
    for name, p in block.named_parameters():
        # the penalty does not depend on the last biases (they shift the output, not its input gradient): torch
        # leaves their .grad None, ours holds zeros or None
        expect = theirs[name].grad.numpy() if theirs[name].grad is not None else np.zeros(tuple(p.shape))
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            expect = expect.T  # HF's Conv1D layout
        got = p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape))
        np.testing.assert_allclose(got, expect, rtol=1e-8, atol=1e-12, err_msg=name)
        checked += theirs[name].grad is not None and np.abs(expect).max() > 1e-6
    assert checked >= 10  # every weight and the inner biases get a real second-order gradient


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _critic(m):
    nn = m.nn
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 4, 3),
                         nn.AvgPool2d(2, stride=1), nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 1))


def test_wgan_gp_step_matches_torch():
    torch.manual_seed(0)
    theirs = _critic(torch).double()
    ours = _critic(it).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(1)
    real, fake, alpha = rng.standard_normal((3, 1, 8, 8)), rng.standard_normal((3, 1, 8, 8)), rng.random((3, 1, 1, 1))

    def step(m, critic):
        mixed = m.tensor(alpha * real + (1 - alpha) * fake, requires_grad=True)
        (g,) = m.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
        norms = (g.reshape(3, -1) ** 2).sum(1).sqrt()
        loss = critic(m.tensor(fake)).mean() - critic(m.tensor(real)).mean() + 10 * ((norms - 1) ** 2).mean()
        loss.backward()
        return loss

    np.testing.assert_allclose(step(it, ours).item(), step(torch, theirs).item(), rtol=1e-10)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)
