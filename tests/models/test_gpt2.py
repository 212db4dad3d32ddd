import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.gpt2.io import WeightsError

transformers = pytest.importorskip("transformers")

SMALL = dict(block_size=32, vocab_size=512, n_layer=2, n_head=4, n_embd=64)


def small_model(seed=0, **overrides):
    it.manual_seed(seed)
    return GPT2(GPT2Config(**{**SMALL, **overrides}))


def hf_twin(model, tmp_path):
    """The same weights in Hugging Face's GPT2LMHeadModel, loaded from our save_pretrained output."""
    model.save_pretrained(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager")
    hf.eval()
    return hf


def batch(seed=1, B=4, T=32, V=512):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(B, T + 1))
    return tokens[:, :-1], tokens[:, 1:]


def hf_param(hf, name):
    """Our parameter name -> HF tensor in our (out, in) layout."""
    p = dict(hf.named_parameters())[name]
    if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and "transformer.h." in name:
        return p.T
    return p


def test_logits_loss_and_gradients_match_hf_gpt2(tmp_path):
    model = small_model()
    hf = hf_twin(model, tmp_path)
    x, y = batch()
    logits, loss = model(it.tensor(x), it.tensor(y))
    loss.backward()
    hf_logits = hf(torch.tensor(x)).logits
    hf_loss = torch.nn.functional.cross_entropy(hf_logits.view(-1, 512), torch.tensor(y).view(-1))
    hf_loss.backward()
    np.testing.assert_allclose(logits.numpy(), hf_logits.detach().numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(loss.item(), hf_loss.item(), rtol=1e-5)
    hf_grads = {}
    for name, p in hf.named_parameters():
        g = p.grad
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            g = g.T
        hf_grads[name] = g.numpy()
    ours = dict(model.named_parameters())
    assert set(ours) == set(hf_grads) - {"lm_head.weight"} or set(ours) == set(hf_grads)
    for name, p in ours.items():
        np.testing.assert_allclose(p.grad.numpy(), hf_grads[name], atol=1e-4, rtol=1e-3, err_msg=name)


def test_ten_adamw_steps_match_torch(tmp_path):
    model = small_model()
    hf = hf_twin(model, tmp_path)
    hf.train()
    x, y = batch()
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95))
    decay = [p for p in hf.parameters() if p.dim() >= 2]
    no_decay = [p for p in hf.parameters() if p.dim() < 2]
    hf_opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    ours, theirs = [], []
    for _ in range(10):
        opt.zero_grad()
        _, loss = model(it.tensor(x), it.tensor(y))
        loss.backward()
        opt.step()
        ours.append(loss.item())
        hf_opt.zero_grad()
        logits = hf(torch.tensor(x)).logits
        hf_loss = torch.nn.functional.cross_entropy(logits.view(-1, 512), torch.tensor(y).view(-1))
        hf_loss.backward()
        hf_opt.step()
        theirs.append(hf_loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert ours[-1] < ours[0] - 0.5  # it really trains


def test_init_follows_llmc():
    model = small_model(n_layer=4, n_embd=128, vocab_size=1024)
    w = model.transformer.h[0].mlp.c_fc.weight.numpy()
    proj = model.transformer.h[0].mlp.c_proj.weight.numpy()
    assert abs(w.std() - 0.02) < 0.001
    assert abs(proj.std() - 0.02 / np.sqrt(2 * 4)) < 0.001
    assert model.lm_head.weight is model.transformer.wte.weight
    np.testing.assert_array_equal(model.transformer.h[0].attn.c_attn.bias.numpy(), 0.0)


def test_configure_optimizers_decays_2d_params_only():
    model = small_model()
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_presets():
    cfg = GPT2Config.from_preset("d12")
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd) == (12, 12, 768)
    assert GPT2Config.from_preset("gpt2-xl").n_embd == 1600
    with pytest.raises(ValueError, match="did you mean 'gpt2'"):
        GPT2Config.from_preset("gtp2")


def test_sequence_longer_than_block_size_is_a_clear_error():
    model = small_model()
    with pytest.raises(ValueError, match="exceeds block_size 32"):
        model(it.tensor(np.zeros((1, 33), np.int64)))


def test_hf_round_trip_is_lossless(tmp_path):
    model = small_model()
    model.save_pretrained(tmp_path / "m")
    again = GPT2.from_pretrained(tmp_path / "m")
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_llmc_round_trip_is_lossless_and_padded(tmp_path):
    model = small_model(vocab_size=500)
    path = tmp_path / "model.bin"
    model.save_llmc(path)
    header = np.fromfile(path, dtype=np.int32, count=256)
    assert list(header[:8]) == [20240326, 3, 32, 500, 2, 4, 64, 512]
    again = GPT2.from_pretrained(path)
    assert again.config == model.config
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)


def test_llmc_bad_magic_and_truncation_name_file_and_tensor(tmp_path):
    model = small_model()
    path = tmp_path / "model.bin"
    model.save_llmc(path)
    raw = path.read_bytes()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(np.int32(20240520).tobytes() + raw[4:])
    with pytest.raises(WeightsError, match=r"bad\.bin: bad magic number 20240520"):
        GPT2.from_pretrained(bad)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(WeightsError, match=r"cut\.bin: truncated at tensor 'attn\.c_proj\.weight'|cut\.bin: truncated"):
        GPT2.from_pretrained(cut)


def test_hf_shape_mismatch_names_the_tensor(tmp_path):
    from safetensors.numpy import load_file, save_file

    model = small_model()
    model.save_pretrained(tmp_path / "m")
    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    tensors["transformer.wpe.weight"] = tensors["transformer.wpe.weight"][:10]
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    msg = r"tensor 'transformer\.wpe\.weight' has shape \(10, 64\), expected \(32, 64\)"
    with pytest.raises(WeightsError, match=msg):
        GPT2.from_pretrained(tmp_path / "m")


def test_missing_path_is_clear():
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        GPT2.from_pretrained("/nonexistent/model.bin")


def test_gradient_accumulation_equals_the_full_batch_gradient():
    model = small_model()
    x, y = batch(B=4)
    _, loss = model(it.tensor(x), it.tensor(y))
    loss.backward()
    full = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    for half in (slice(0, 2), slice(2, 4)):
        _, loss = model(it.tensor(x[half]), it.tensor(y[half]))
        (loss / 2).backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), full[n], rtol=1e-4, atol=1e-7, err_msg=n)
