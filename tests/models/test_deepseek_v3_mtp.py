"""DeepSeek-V3's multi-token prediction (models/deepseek_v3/mtp.py) against a reference written here with torch from
HF's modules and the same weights (float64, 1e-10: the loss, the MTP loss and every gradient); the loss is the main
loss + mtp_loss_weight x the mean over the depths; DeepSeek's checkpoint names read, written and read again; with
num_nextn_predict_layers = 0 the model is what it was (bitwise)."""
import json

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.models.deepseek_v3 import DeepseekV3Config
from infini_train.models.deepseek_v3.model import DeepseekV3
from infini_train.safetensors_io import read_safetensors

from .deepseek_v3_setup import batch, grads_by_hf_name, hf_config, hf_float64, shifted_targets

N = 3  # main layers (the first dense, the others DeepSeek-MoE; the MTP blocks MoE)
EXTRA = ("enorm", "hnorm", "shared_head.norm")


def mtp_pair(tmp_path, depths=2, seed=0, **kwargs):
    """(ours, HF's model running the N main layers, {name: torch parameter} of the MTP modules in HF's names): HF
    built with N + depths layers (its forward runs num_hidden_layers = N of them; the others are the MTP blocks),
    with enorm, hnorm, eh_proj and shared_head.norm added, saved as DeepSeek's checkpoints are and read as ours."""
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    torch.manual_seed(seed)
    config = hf_config(layers=N + depths, **kwargs)
    hf = DeepseekV3ForCausalLM(config)
    H = config.hidden_size
    extra = {}
    for k in range(depths):
        at = f"model.layers.{N + k}."
        for norm in EXTRA:
            extra[at + norm + ".weight"] = DeepseekV3RMSNorm(H, eps=config.rms_norm_eps).weight
        extra[at + "eh_proj.weight"] = torch.nn.Linear(2 * H, H, bias=False).weight
    with torch.no_grad():
        for name, p in list(hf.named_parameters()) + list(extra.items()):
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    directory = tmp_path / f"hf_mtp{seed}"
    hf.save_pretrained(directory)
    from safetensors.torch import load_file, save_file

    stored = load_file(directory / "model.safetensors")
    for k in range(depths):  # the shared embedding and head, stored as the checkpoints have them
        stored[f"model.layers.{N + k}.embed_tokens.weight"] = stored["model.embed_tokens.weight"]
        head = stored.get("lm_head.weight", stored["model.embed_tokens.weight"])
        stored[f"model.layers.{N + k}.shared_head.head.weight"] = head
    stored.update({name: p.detach() for name, p in extra.items()})
    save_file({n: t.contiguous().clone() for n, t in stored.items()}, directory / "model.safetensors",
              metadata={"format": "pt"})
    text = json.loads((directory / "config.json").read_text())
    text.update(num_hidden_layers=N, num_nextn_predict_layers=depths)
    (directory / "config.json").write_text(json.dumps(text))
    config.num_hidden_layers = N  # HF's forward: the main layers only
    return DeepseekV3.from_pretrained(directory), hf, extra, directory


def reference(hf, extra, x, depths, weight):
    """(total loss, main loss, MTP loss) in torch: DeepSeek-V3's MTP modules on HF's layers."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    captured = {}
    hook = hf.model.norm.register_forward_hook(lambda m, args, out: captured.update(h=args[0]))
    ids = torch.tensor(x)
    out = hf(ids)
    hook.remove()
    V = out.logits.shape[-1]
    labels = torch.tensor(shifted_targets(x))
    main = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), labels.reshape(-1), ignore_index=-1)
    h, B, T = captured["h"], x.shape[0], x.shape[1]
    position_ids = torch.arange(T)[None]
    rope = hf.model.rotary_emb(h, position_ids)

    def norm(name):
        module = DeepseekV3RMSNorm(h.shape[-1], eps=hf.config.rms_norm_eps)
        module.weight = extra[name]
        return module

    losses = []
    for k in range(1, depths + 1):
        at = f"model.layers.{N + k - 1}."
        shifted = torch.cat([ids[:, k:], torch.zeros(B, k, dtype=ids.dtype)], 1)
        emb = hf.model.embed_tokens(shifted)
        joined = torch.cat([norm(at + "enorm.weight")(emb), norm(at + "hnorm.weight")(h)], -1)
        h = hf.model.layers[N + k - 1](joined @ extra[at + "eh_proj.weight"].T, position_embeddings=rope,
                                       attention_mask=None, position_ids=position_ids)
        logits = hf.lm_head(norm(at + "shared_head.norm.weight")(h))
        target = torch.cat([labels[:, k:], torch.full((B, k), -1, dtype=labels.dtype)], 1)
        losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=-1))
    mtp = sum(losses) / depths
    return main + weight * mtp, main, mtp


@pytest.mark.parametrize("depths,kwargs", [(1, {}), (2, {}), (2, dict(tie_word_embeddings=True, q_lora_rank=None))])
def test_float64_mtp_loss_and_every_gradient_equal_the_torch_reference(tmp_path, depths, kwargs):
    ours, hf, extra, _ = mtp_pair(tmp_path, depths, **kwargs)
    weight = 0.3
    assert ours.mtp_loss_weight == weight and len(ours.mtp) == depths
    x = batch(T=16)
    with hf_float64(ours, hf, x.shape[1]):
        for p in extra.values():
            p.data = p.data.double()
        ours.train()
        hf.train()
        _, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
        total, main, mtp = reference(hf, extra, x, depths, weight)
        errors = {"loss": abs(loss.item() - total.item()), "mtp_loss": abs(ours.mtp_loss.item() - mtp.item())}
        np.testing.assert_allclose(ours.mtp_loss.item(), mtp.item(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(loss.item(), total.item(), rtol=1e-10, atol=1e-10)
        # the loss is the main loss + weight x the mean over the depths
        np.testing.assert_allclose(loss.item(), main.item() + weight * ours.mtp_loss.item(), rtol=1e-12)
        loss.backward()
        total.backward()
    grads = {ours.to_hf_name(name): g for name, g in grads_by_hf_name(ours).items()}
    references = dict(hf.named_parameters())
    references.update(extra)
    assert set(grads) == set(references)
    worst = 0.0
    for name, p in references.items():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-10, atol=1e-10, err_msg=name)
        worst = max(worst, float(np.abs(grads[name] - p.grad.numpy()).max()))
    errors["grads"] = worst
    print(depths, kwargs, errors)


def test_hf_names_read_written_and_read_again_equal(tmp_path):
    ours, _, _, directory = mtp_pair(tmp_path, 2)
    original = read_safetensors(str(directory / "model.safetensors"))
    ours.save_pretrained(tmp_path / "written")
    written = read_safetensors(str(tmp_path / "written" / "model.safetensors"))
    assert sorted(written) == sorted(original)  # model.layers.{N+k}.{enorm, ..., embed_tokens, shared_head.head}
    for name, value in original.items():
        np.testing.assert_array_equal(np.asarray(written[name]), np.asarray(value), err_msg=name)
    config = json.loads((tmp_path / "written" / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 2 and config["num_hidden_layers"] == N
    again = DeepseekV3.from_pretrained(tmp_path / "written")
    first, second = ours.state_dict(), again.state_dict()
    assert sorted(first) == sorted(second) and "mtp.1.shared_head.head.weight" in first
    for name in first:
        np.testing.assert_array_equal(first[name].numpy(), second[name].numpy(), err_msg=name)
    # the shared embedding and head are the model's own (read by tying)
    assert again.mtp[1].embed_tokens is again.model.embed_tokens and again.mtp[0].shared_head.head is again.lm_head


def test_without_mtp_the_model_is_unchanged_bitwise():
    config = DeepseekV3Config.from_preset("deepseek-v3-tiny", n_layers=2)
    x = batch(T=12) % 257
    results = []
    for depths, weight in ((0, 0.3), (2, 0.0)):
        it.manual_seed(5)
        model = DeepseekV3(DeepseekV3Config(**{**config.to_dict(), "num_nextn_predict_layers": depths}))
        model.mtp_loss_weight = weight
        model.train()
        _, loss = model(it.tensor(x), it.tensor(shifted_targets(x)))
        loss.backward()
        results.append((model, loss.item()))
    (plain, plain_loss), (with_mtp, mtp_loss) = results
    assert "mtp" not in plain._modules and not any(k.startswith("mtp.") for k in plain.state_dict())
    assert plain.hf_config("float32")["num_nextn_predict_layers"] == 0
    # the main weights initialise as before (the MTP modules after them), and with weight 0 the loss and the main
    # model's gradients are the model's without MTP, bit for bit
    assert plain_loss == mtp_loss
    mine = dict(with_mtp.named_parameters())
    for name, p in plain.named_parameters():
        np.testing.assert_array_equal(mine[name].numpy(), p.numpy(), err_msg=name)
        np.testing.assert_array_equal(mine[name].grad.numpy(), p.grad.numpy(), err_msg=name)


def test_generation_and_evaluation_ignore_mtp(tmp_path):
    config = DeepseekV3Config.from_preset("deepseek-v3-tiny", n_layers=2, num_nextn_predict_layers=1)
    it.manual_seed(0)
    model = DeepseekV3(config)
    x = batch(T=12) % 257
    model.eval()
    _, loss = model(it.tensor(x), it.tensor(shifted_targets(x)))
    model.train()
    _, trained = model(it.tensor(x), it.tensor(shifted_targets(x)))
    assert model.mtp_loss is not None
    np.testing.assert_allclose(trained.item(), loss.item() + 0.3 * model.mtp_loss.item(), rtol=1e-6)
    out = model.generate(it.tensor(x[:1, :4]), 3, temperature=0.0 if False else 1.0, top_k=1)
    assert out.shape == (1, 7)


def test_flops_count_the_mtp_modules_active_parameters_attention_and_head():
    base = DeepseekV3Config.from_preset("deepseek-v3-tiny")
    plain, mtp = DeepseekV3(base), DeepseekV3(DeepseekV3Config(**{**base.to_dict(), "num_nextn_predict_layers": 1}))
    T, c = 64, base
    own = mtp.num_params(non_embedding=True) - plain.num_params(non_embedding=True)  # the module's parameters
    idle = (c.n_routed_experts - c.num_experts_per_tok) * 3 * c.dim * c.moe_intermediate_size
    extra = 6 * (own - idle) + 6 * c.n_heads * T * (c.head_dim + c.v_head_dim) + 6 * c.vocab_size * c.dim
    assert mtp.flops_per_token(T) - plain.flops_per_token(T) == extra


def test_packed_documents_compute_as_each_document_alone():
    """Two documents in one row: the summed token losses (main and MTP) are those of each document alone."""
    from infini_train.models.documents import packed_documents
    from infini_train.models.token_loss import loss_over_tokens

    config = DeepseekV3Config.from_preset("deepseek-v3-tiny", n_layers=2, num_nextn_predict_layers=2)
    it.manual_seed(3)
    model = DeepseekV3(config).double()
    model.train()
    first, second = batch(seed=7, B=1, T=7) % 257, batch(seed=8, B=1, T=9) % 257

    def losses(x, layout=None):
        with loss_over_tokens(1.0), packed_documents(*layout) if layout else packed_documents(None):
            _, loss = model(it.tensor(x), it.tensor(shifted_targets(x)))
        return loss.item(), model.mtp_loss.item()

    alone = np.add(losses(first), losses(second))
    x = np.concatenate([first, second], 1)
    positions = np.concatenate([np.arange(7), np.arange(9)])[None]
    segments = np.array([[1] * 7 + [2] * 9])
    targets = np.concatenate([shifted_targets(first), shifted_targets(second)], 1)
    with loss_over_tokens(1.0), packed_documents(positions, segments):
        _, loss = model(it.tensor(x), it.tensor(targets))
    np.testing.assert_allclose([loss.item(), model.mtp_loss.item()], alone, rtol=1e-12)


def test_float32_mtp_loss_and_every_gradient_equal_the_torch_reference(tmp_path):
    """As HF runs (its float32 norms and router, each side's own rotary tables): 1e-5."""
    ours, hf, extra, _ = mtp_pair(tmp_path, 2)
    x = batch(T=16)
    ours.train()
    hf.train()
    _, loss = ours(it.tensor(x), it.tensor(shifted_targets(x)))
    total, _, mtp = reference(hf, extra, x, 2, 0.3)
    np.testing.assert_allclose([loss.item(), ours.mtp_loss.item()], [total.item(), mtp.item()], rtol=1e-5, atol=1e-5)
    loss.backward()
    total.backward()
    grads = {ours.to_hf_name(name): g for name, g in grads_by_hf_name(ours).items()}
    references = {**dict(hf.named_parameters()), **extra}
    worst = 0.0
    for name, p in references.items():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
        worst = max(worst, float(np.abs(grads[name] - p.grad.numpy()).max()))
    print("float32 worst gradient error", worst)
