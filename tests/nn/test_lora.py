"""LoRA adapters: the layer against a torch formula and PEFT's own LoraLayer, merging, apply_lora's matching and
freezing, PEFT's files both ways with Hugging Face GPT-2 (logits, merged weights), a short fine-tune that moves only
the adapters, error messages, and tensor-parallel wrappers in a group of one."""
import json
import warnings

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn
from infini_train.distributed.process_group import SingleProcessGroup
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.nn import lora
from infini_train.nn.parallel import ColumnParallelLinear, RowParallelLinear

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TARGETS = ["c_attn", "c_proj", "c_fc"]
TINY = dict(block_size=16, vocab_size=67, n_layer=2, n_head=4, n_embd=32)


def tiny_gpt2(seed=0):
    it.manual_seed(seed)
    return GPT2(GPT2Config(**TINY))


def randomise(params, seed=1, scale=0.1):
    rng = np.random.default_rng(seed)
    with it.no_grad():
        for p in params:
            p.copy_(it.tensor(rng.normal(0, scale, p.shape).astype(p.numpy().dtype)))


def tokens(seed=2, B=2, T=16):
    return np.random.default_rng(seed).integers(0, TINY["vocab_size"], (B, T + 1))


def close(a, b, rtol, atol=1e-6, what=""):
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else (a.numpy() if hasattr(a, "numpy") else a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else (b.numpy() if hasattr(b, "numpy") else b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)


# ------------------------------------------------------------------------------------------------ layer
def lora_linear(rank=4, alpha=8, seed=0):
    it.manual_seed(seed)
    layer = lora.LoRALinear(nn.Linear(6, 5), rank, alpha)
    randomise([layer.lora_A.weight, layer.lora_B.weight], seed=seed + 1, scale=0.5)
    return layer


def test_a_fresh_adapter_changes_nothing_and_starts_like_peft():
    it.manual_seed(0)
    base = nn.Linear(6, 5)
    x = it.randn(3, 6)
    before = base(x).numpy().copy()
    layer = lora.LoRALinear(base, 4, 8)
    assert np.array_equal(layer(x).numpy(), before)
    assert not layer.lora_B.weight.numpy().any() and layer.lora_A.weight.numpy().any()
    bound = 1 / np.sqrt(6)  # kaiming-uniform with a=sqrt(5): U(-1/sqrt(in), 1/sqrt(in))
    assert np.abs(layer.lora_A.weight.numpy()).max() <= bound
    assert layer.scaling == 2.0 and lora.LoRALinear(nn.Linear(6, 5), 4, 8, use_rslora=True).scaling == 4.0
    assert list(layer.state_dict()) == ["base_layer.weight", "base_layer.bias", "lora_A.weight", "lora_B.weight"]
    assert tuple(layer.lora_A.weight.shape) == (4, 6) and tuple(layer.lora_B.weight.shape) == (5, 4)


def test_forward_and_backward_match_torch_and_peft():
    layer = lora_linear()
    rng = np.random.default_rng(5)
    x_np, g_np = rng.normal(size=(2, 3, 6)).astype(np.float32), rng.normal(size=(2, 3, 5)).astype(np.float32)
    x = it.tensor(x_np, requires_grad=True)
    y = layer(x)
    y.backward(it.tensor(g_np))
    W, b, A, B = (torch.tensor(t.numpy(), requires_grad=True) for t in
                  (layer.base_layer.weight, layer.base_layer.bias, layer.lora_A.weight, layer.lora_B.weight))
    tx = torch.tensor(x_np, requires_grad=True)
    ref = tx @ W.T + b + (tx @ A.T) @ B.T * 2.0
    ref.backward(torch.tensor(g_np))
    close(y, ref, 1e-6, what="output vs formula")
    close(x.grad, tx.grad, 1e-6, what="input gradient")
    close(layer.lora_A.weight.grad, A.grad, 1e-6, what="A gradient")
    close(layer.lora_B.weight.grad, B.grad, 1e-6, what="B gradient")
    assert layer.base_layer.weight.grad is None and layer.base_layer.bias.grad is None
    assert not layer.base_layer.weight.requires_grad and not layer.base_layer.bias.requires_grad

    base = torch.nn.Linear(6, 5)
    with torch.no_grad():
        base.weight.copy_(W)
        base.bias.copy_(b)
    theirs = peft.tuners.lora.Linear(base, "default", peft.LoraConfig(r=4, lora_alpha=8), r=4, lora_alpha=8)
    with torch.no_grad():
        theirs.lora_A["default"].weight.copy_(A)
        theirs.lora_B["default"].weight.copy_(B)
    px = torch.tensor(x_np, requires_grad=True)
    py = theirs(px)
    py.backward(torch.tensor(g_np))
    close(y, py, 1e-6, what="output vs PEFT")
    close(x.grad, px.grad, 1e-6, what="input gradient vs PEFT")
    close(layer.lora_A.weight.grad, theirs.lora_A["default"].weight.grad, 1e-6, what="A gradient vs PEFT")
    close(layer.lora_B.weight.grad, theirs.lora_B["default"].weight.grad, 1e-6, what="B gradient vs PEFT")


def test_merge_and_unmerge():
    layer = lora_linear()
    x = it.randn(4, 6)
    weight = layer.base_layer.weight.numpy().copy()
    before = layer(x).numpy().copy()
    layer.merge()
    assert layer.merged
    close(layer(x), before, 1e-5, what="merged output")
    expected = weight + layer.lora_B.weight.numpy() @ layer.lora_A.weight.numpy() * layer.scaling
    close(layer.base_layer.weight, expected, 1e-6)
    with pytest.warns(UserWarning, match="already merged"):
        layer.merge()  # PEFT warns and does nothing
    close(layer.base_layer.weight, expected, 1e-6)
    layer.unmerge()
    assert not layer.merged
    close(layer.base_layer.weight, weight, 0, atol=1e-6, what="unmerged weight")
    close(layer(x), before, 1e-5)
    with pytest.warns(UserWarning, match="not merged"):
        layer.unmerge()


def test_dropout_acts_on_the_adapter_input_in_training_only():
    it.manual_seed(0)
    layer = lora.LoRALinear(nn.Linear(6, 5), 4, 8, dropout=0.5)
    randomise([layer.lora_B.weight])
    plain = lora.LoRALinear(layer.base_layer, 4, 8)
    with it.no_grad():
        plain.lora_A.weight.copy_(layer.lora_A.weight.detach())
        plain.lora_B.weight.copy_(layer.lora_B.weight.detach())
    x = it.randn(8, 6)
    assert not np.allclose(layer(x).numpy(), plain(x).numpy())
    layer.eval()
    close(layer(x), plain(x), 1e-6)


# --------------------------------------------------------------------------------------------- apply_lora
def test_apply_lora_wraps_the_targets_in_place_and_freezes_the_rest():
    model = tiny_gpt2()
    order = [name for name, _ in model.named_modules()]
    x = it.tensor(tokens()[:, :-1])
    before, _ = model(x)
    assert lora.apply_lora(model, 4, 8, target_modules=TARGETS) is model
    names = [name for name, _ in lora.named_lora_layers(model)]
    assert names == [f"transformer.h.{i}.{m}" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                                           "mlp.c_proj")]
    assert [n for n, _ in model.named_modules() if not n.endswith(("base_layer", "lora_A", "lora_B",
                                                                   "lora_dropout"))] == order
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [f"{n}.{part}.weight" for n in names for part in ("lora_A", "lora_B")]
    assert [id(p) for p in lora.lora_parameters(model)] == [id(p) for n, p in model.named_parameters()
                                                            if p.requires_grad]
    assert list(lora.lora_state_dict(model)) == trainable
    after, _ = model(x)
    assert np.array_equal(after.numpy(), before.numpy())


def test_apply_lora_matches_like_peft():
    regex = lora.apply_lora(tiny_gpt2(), 2, 4, target_modules=r".*\.attn\.c_(attn|proj)")
    assert [n for n, _ in lora.named_lora_layers(regex)] == [f"transformer.h.{i}.attn.{m}" for i in range(2)
                                                             for m in ("c_attn", "c_proj")]
    excluded = lora.apply_lora(tiny_gpt2(), 2, 4, target_modules=["c_proj"], exclude_modules=["mlp.c_proj"])
    assert [n for n, _ in lora.named_lora_layers(excluded)] == ["transformer.h.0.attn.c_proj",
                                                                "transformer.h.1.attn.c_proj"]
    full_name = lora.apply_lora(tiny_gpt2(), 2, 4, target_modules=["transformer.h.1.mlp.c_fc"])
    assert [n for n, _ in lora.named_lora_layers(full_name)] == ["transformer.h.1.mlp.c_fc"]
    every = lora.apply_lora(tiny_gpt2(), 2, 4)  # "all-linear": not the output layer
    assert len(lora.named_lora_layers(every)) == 8 and every.lora_settings.target_modules == sorted(TARGETS)


def test_apply_lora_errors():
    with pytest.raises(lora.LoRAError, match=r"no linear layer matches target_modules \['c_atn'\].*"
                                             r"transformer\.h\.0\.attn\.c_attn(.|\n)*did you mean \['c_attn'\]"):
        lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["c_atn"])
    with pytest.raises(lora.LoRAError, match="'transformer.h.0.attn' is a CausalSelfAttention"):
        lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["attn"])
    model = lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=TARGETS)
    with pytest.raises(lora.LoRAError, match="already has LoRA adapters"):
        lora.apply_lora(model, 4, 8, target_modules=TARGETS)
    with pytest.raises(lora.LoRAError, match="positive rank"):
        lora.LoRALinear(nn.Linear(3, 3), 0, 8)
    with pytest.raises(lora.LoRAError, match="LoRALinear: expected an nn.Linear, got ColumnParallelLinear"):
        lora.LoRALinear(ColumnParallelLinear(3, 3, group=SingleProcessGroup()), 2, 4)
    with pytest.raises(lora.LoRAError, match="got LoRALinear(.|\n)*wrapped once"):
        lora.LoRALinear(lora.LoRALinear(nn.Linear(3, 3), 2, 4), 2, 4)
    with pytest.raises(lora.LoRAError, match="expected target_modules as a non-empty list"):
        lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=[])
    with pytest.warns(UserWarning, match=r"tied to other parameters \(lm_head.weight, transformer.wte.weight\)"):
        lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["lm_head"])


# ---------------------------------------------------------------------------------------------- PEFT files
@pytest.fixture
def hf_gpt2(tmp_path):
    """A random HF GPT-2, and our GPT2 loaded from its save_pretrained directory."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=67,
                                     bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path / "base")
    return hf, tmp_path


def hf_logits(model, x):
    with torch.no_grad():
        return model(torch.tensor(x)).logits


@pytest.mark.parametrize("use_rslora", [False, True], ids=["alpha-over-r", "rslora"])
def test_our_adapter_loads_in_peft(hf_gpt2, use_rslora):
    hf, tmp = hf_gpt2
    model = GPT2.from_pretrained(tmp / "base")
    x = tokens()[:, :-1]
    base_logits, _ = model(it.tensor(x))
    lora.apply_lora(model, 4, 8, target_modules=TARGETS, use_rslora=use_rslora)
    randomise(lora.lora_parameters(model))
    assert lora.save_adapter(model, tmp / "ours", base_model_name_or_path="tiny-gpt2") == tmp / "ours"
    logits, _ = model(it.tensor(x))
    assert np.abs(logits.numpy() - base_logits.numpy()).max() > 1e-2  # the adapters matter
    theirs = peft.PeftModel.from_pretrained(hf, str(tmp / "ours")).eval()
    close(logits, hf_logits(theirs, x), 1e-4, atol=1e-5, what="logits under PEFT")
    config = json.loads((tmp / "ours" / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True and config["target_modules"] == sorted(TARGETS)
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    assert config["use_rslora"] is use_rslora
    assert config["base_model_name_or_path"] == "tiny-gpt2" and config["task_type"] == "CAUSAL_LM"


def test_peft_adapter_loads_here_with_peft_config_and_keys(hf_gpt2):
    hf, tmp = hf_gpt2
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.1, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "fan_in_fan_out is set to False but the target module is Conv1D"
        theirs = peft.get_peft_model(hf, config)
    rng = np.random.default_rng(3)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_" in name:
                p.copy_(torch.tensor(rng.normal(0, 0.1, tuple(p.shape)), dtype=p.dtype))
    theirs.save_pretrained(str(tmp / "peft"))
    model = lora.load_adapter(GPT2.from_pretrained(tmp / "base"), tmp / "peft").eval()
    x = tokens()[:, :-1]
    logits, _ = model(it.tensor(x))
    close(logits, hf_logits(theirs.eval(), x), 1e-4, atol=1e-5, what="logits of a PEFT adapter")
    layer = model.transformer.h[0].mlp.c_fc
    assert (layer.r, layer.lora_alpha, layer.scaling, layer.lora_dropout.p) == (4, 16, 4.0, 0.1)

    lora.save_adapter(model, tmp / "again")  # the same files PEFT writes, but for peft_version
    ours = json.loads((tmp / "again" / "adapter_config.json").read_text())
    peft_config = json.loads((tmp / "peft" / "adapter_config.json").read_text())
    assert set(ours) == set(peft_config) - {"peft_version"}
    assert {k: ours[k] for k in ours if k != "target_modules"} == \
        {k: peft_config[k] for k in ours if k != "target_modules"}
    assert sorted(ours["target_modules"]) == sorted(peft_config["target_modules"])
    from safetensors.numpy import load_file
    saved, original = load_file(tmp / "again" / "adapter_model.safetensors"), \
        load_file(tmp / "peft" / "adapter_model.safetensors")
    assert set(saved) == set(original)
    for key in original:
        assert np.array_equal(saved[key], original[key]), key


def test_merged_weights_equal_peft_merge_and_unload(hf_gpt2):
    hf, tmp = hf_gpt2
    model = lora.apply_lora(GPT2.from_pretrained(tmp / "base"), 4, 8, target_modules=TARGETS)
    randomise(lora.lora_parameters(model))
    lora.save_adapter(model, tmp / "ours")
    x = tokens()[:, :-1]
    adapted, _ = model(it.tensor(x))
    lora.merge_lora(model)
    merged_logits, _ = model(it.tensor(x))
    close(merged_logits, adapted, 1e-4, atol=1e-5, what="merged logits")
    lora.unmerge_lora(model)
    plain = lora.merge_and_unload(model)
    assert not lora.named_lora_layers(plain) and "transformer.h.0.attn.c_attn.weight" in plain.state_dict()
    theirs = peft.PeftModel.from_pretrained(hf, str(tmp / "ours")).merge_and_unload()
    hf_state = theirs.state_dict()
    for name, value in plain.state_dict().items():
        expected = hf_state[name].numpy()
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            expected = expected.T  # HF's Conv1D layout
        close(value, expected, 1e-5, atol=1e-6, what=name)


def test_lora_fine_tune_moves_only_the_adapters():
    model = lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=TARGETS)
    frozen = {n: p.numpy().copy() for n, p in model.named_parameters() if not p.requires_grad}
    batch = tokens(seed=4, B=4)
    x, y = it.tensor(batch[:, :-1]), it.tensor(batch[:, 1:])
    optimizer = it.optim.AdamW(lora.lora_parameters(model), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(20):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3 and losses[-1] == min(losses), losses
    for name, p in model.named_parameters():
        if name in frozen:
            assert np.array_equal(p.numpy(), frozen[name]), f"{name} changed"
            assert p.grad is None, f"{name} got a gradient"


# ------------------------------------------------------------------------------------------------- errors
def test_loading_a_mismatched_adapter_names_the_keys(tmp_path):
    source = lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["c_attn", "c_fc"])
    lora.save_adapter(source, tmp_path / "ad")
    fewer = lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["c_attn", "c_proj"])
    with pytest.raises(lora.LoRAError, match=r"(?s)missing adapters \(8\): transformer\.h\.0\.attn\.c_proj\.lora_A"
                                             r".*unexpected entries \(4\): transformer\.h\.0\.mlp\.c_fc\.lora_A"
                                             r".*HINT"):
        lora.load_adapter(fewer, tmp_path / "ad")
    wider = GPT2(GPT2Config(**{**TINY, "n_embd": 64}))
    with pytest.raises(lora.LoRAError, match=r"shape mismatches \(8\): transformer\.h\.0\.attn\.c_attn\.lora_A\.weight"
                                             r": expected \(4, 64\), got \(4, 32\)"):
        lora.load_adapter(wider, tmp_path / "ad")
    other_rank = lora.apply_lora(tiny_gpt2(), 8, 8, target_modules=["c_attn", "c_fc"])
    with pytest.raises(lora.LoRAError, match=r"r, lora_alpha, use_rslora = \(4, 8, False\).*\(8, 8, False\)"):
        lora.load_adapter(other_rank, tmp_path / "ad")


def test_unsupported_or_missing_adapter_files(tmp_path):
    source = lora.apply_lora(tiny_gpt2(), 4, 8, target_modules=["c_attn"])
    lora.save_adapter(source, tmp_path / "ad")
    config_path = tmp_path / "ad" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_dora": True, "rank_pattern": {"c_attn": 8}}))
    with pytest.raises(lora.LoRAError, match=r"use_dora=True \(DoRA\); rank_pattern=\{'c_attn': 8\} \(per-layer "
                                             r"ranks\)"):
        lora.load_adapter(tiny_gpt2(), tmp_path / "ad")
    config_path.write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(lora.LoRAError, match="expected peft_type 'LORA', got 'IA3'"):
        lora.load_adapter(tiny_gpt2(), tmp_path / "ad")
    config_path.write_text(json.dumps(config))
    weights = tmp_path / "ad" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(lora.LoRAError, match="not a readable adapter file: .*truncated or damaged"):
        lora.load_adapter(tiny_gpt2(), tmp_path / "ad")
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        lora.load_adapter(tiny_gpt2(), tmp_path / "nowhere")
    with pytest.raises(lora.LoRAError, match="has no LoRA adapters"):
        lora.save_adapter(tiny_gpt2(), tmp_path / "none")
    with pytest.raises(lora.LoRAError, match=r"config_extra may not change \['r'\]"):
        lora.save_adapter(source, tmp_path / "x", config_extra={"r": 16})


def test_a_model_without_hf_conv1d_layers_saves_fan_in_fan_out_false(tmp_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    lora.apply_lora(model, 2, 4, target_modules=["0", "2"])
    lora.save_adapter(model, tmp_path / "ad")
    config = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is False and config["target_modules"] == ["0", "2"]
    again = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    randomise(lora.lora_parameters(model))
    lora.save_adapter(model, tmp_path / "ad")
    lora.load_adapter(again, tmp_path / "ad")
    for (_, a), (_, b) in zip(lora.lora_state_dict(model).items(), lora.lora_state_dict(again).items()):
        assert np.array_equal(a.numpy(), b.numpy())


def test_bfloat16_adapters_round_trip(tmp_path):
    def build():
        it.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)).to(it.bfloat16)

    model = lora.apply_lora(build(), 2, 4)
    randomise(lora.lora_parameters(model))
    assert lora.lora_parameters(model)[0].dtype == it.bfloat16
    lora.save_adapter(model, tmp_path / "ad")
    again = lora.load_adapter(build(), tmp_path / "ad")
    for (_, a), (_, b) in zip(lora.lora_state_dict(model).items(), lora.lora_state_dict(again).items()):
        assert b.dtype == it.bfloat16 and np.array_equal(a.numpy(), b.numpy())


# ------------------------------------------------------------------------------- tensor parallel, group of one
def test_parallel_wrappers_in_a_group_of_one_equal_the_plain_layer():
    one = SingleProcessGroup()
    x = it.randn(2, 4, 6)
    plain = lora_linear()
    for base_cls in (ColumnParallelLinear, RowParallelLinear):
        base = base_cls.from_linear(plain.base_layer, one)
        layer = lora.lora_layer(base, 4, 8)
        assert type(layer).__name__ == base_cls.__name__.replace("Parallel", "ParallelLoRA", 1)
        with it.no_grad():
            layer.lora_A.weight.copy_(plain.lora_A.weight.detach())
            layer.lora_B.weight.copy_(plain.lora_B.weight.detach())
        close(layer(x), plain(x), 1e-6, what=base_cls.__name__)
        assert list(lora.lora_state_dict(layer, whole=True)) == ["lora_A.weight", "lora_B.weight"]
        split = layer.lora_B.weight if base_cls is ColumnParallelLinear else layer.lora_A.weight
        assert split.placement.tensor_shard.dim == (0 if base_cls is ColumnParallelLinear else 1)
