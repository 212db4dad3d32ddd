"""Checks the LLaMA-like models share against their transformers classes: logits, the loss (HF's own, with labels
shifted inside it and, for MoE models, the auxiliary loss), every gradient (HF's fused expert tensors compared with
our per-expert ones), greedy generation with the KV cache, and HF directories both ways."""
import numpy as np
import torch

import infini_train as it


def randomize(model, seed, router_std=0.5):
    """Non-trivial norms (their gradients and values are exercised) and routers that spread tokens."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("gate.weight"):
                p.normal_(0.0, router_std)
    return model.eval()


def batch(vocab, seed=1, B=2, T=24):
    return np.random.default_rng(seed).integers(0, vocab, (B, T))


def shifted_targets(x):
    """Our targets for HF's labels=x: the next token, the last position ignored (HF pads its shifted labels)."""
    return np.concatenate([x[:, 1:], -np.ones((x.shape[0], 1), dtype=x.dtype)], axis=1)


def hf_named_grads(ours):
    """Our gradients under HF's parameter names: experts.{i}.gate_proj / up_proj stacked as experts.gate_up_proj
    (E, 2I, D), experts.{i}.down_proj as experts.down_proj; an expert that saw no token has a zero gradient."""
    grads = {name: (p.grad.numpy() if p.grad is not None else np.zeros(p.shape)) for name, p in
             ours.named_parameters()}
    out = {}
    for name, g in grads.items():
        if ".experts." not in name:
            out[name] = g
            continue
        prefix, rest = name.split(".experts.")
        if not rest.startswith("0."):
            continue
        count = sum(1 for n in grads if n.startswith(prefix + ".experts.") and n.endswith(".gate_proj.weight"))
        expert = [f"{prefix}.experts.{i}." for i in range(count)]
        out[prefix + ".experts.gate_up_proj"] = np.stack([np.concatenate(
            [grads[e + "gate_proj.weight"], grads[e + "up_proj.weight"]], 0) for e in expert])
        out[prefix + ".experts.down_proj"] = np.stack([grads[e + "down_proj.weight"] for e in expert])
    return out


def check_forward_backward(ours, hf, vocab, moe=False):
    """Logits, HF's loss (aux loss included when ``moe``) and every gradient; returns (our loss, HF's output)."""
    x = batch(vocab)
    ours.train()
    logits, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
    hf.train()
    kwargs = {"output_router_logits": True} if moe else {}
    out = hf(torch.tensor(x), labels=torch.tensor(x), **kwargs)
    np.testing.assert_allclose(logits.numpy(), out.logits.detach().numpy(), rtol=1e-4, atol=1e-5)
    if moe:
        assert out.aux_loss is not None and out.aux_loss.item() > 0
        np.testing.assert_allclose(ours.aux_loss.item(), out.aux_loss.item(), rtol=1e-5)
    np.testing.assert_allclose(loss.item(), out.loss.item(), rtol=1e-5)
    loss.backward()
    out.loss.backward()
    ours_grads = hf_named_grads(ours)
    tied = ours.config.tie_word_embeddings
    for name, p in hf.named_parameters():
        if name not in ours_grads:
            assert tied and name == "lm_head.weight", name
            continue
        assert p.grad is not None, name
        np.testing.assert_allclose(ours_grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    hf_names = {name for name, _ in hf.named_parameters()}
    assert set(ours_grads) - {"lm_head.weight"} == hf_names - {"lm_head.weight"}
    assert ("lm_head.weight" in ours_grads) == (not tied)
    return loss, out


def check_generation(ours, hf, vocab, new=20):
    prompt = np.array([[5, 17, 42, 8, 3], [9, 9, 1, 30, 2]]) % vocab
    expected = hf.eval().generate(torch.tensor(prompt), max_new_tokens=new, do_sample=False,
                                  attention_mask=torch.ones_like(torch.tensor(prompt))).numpy()
    assert expected.shape == (2, 5 + new)
    cached = ours.generate(it.tensor(prompt), new, temperature=0).numpy()
    uncached = ours.generate(it.tensor(prompt), new, temperature=0, use_cache=False).numpy()
    assert cached.tolist() == expected.tolist()
    assert uncached.tolist() == expected.tolist()


def check_directories_both_ways(ours, hf, hf_class, our_class, tmp_path, vocab, max_shard_size="5GB"):
    """HF save_pretrained -> it.models.from_pretrained and ours save_pretrained -> HF from_pretrained: the logits."""
    x = batch(vocab, seed=2)
    expected = hf.eval()(torch.tensor(x)).logits.detach().numpy()
    hf.save_pretrained(tmp_path / "hf")
    loaded = it.models.from_pretrained(tmp_path / "hf")
    assert type(loaded) is our_class
    np.testing.assert_allclose(loaded(it.tensor(x))[0].numpy(), expected, rtol=1e-4, atol=1e-5)
    ours.save_pretrained(tmp_path / "ours", max_shard_size=max_shard_size)
    again = hf_class.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(again(torch.tensor(x)).logits.detach().numpy(), expected, rtol=1e-5, atol=1e-6)
    back = it.models.from_pretrained(tmp_path / "ours")
    assert type(back) is our_class and back.config == ours.config
    return tmp_path / "ours"
