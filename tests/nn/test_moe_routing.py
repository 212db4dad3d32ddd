"""it.nn.moe_routing: DeepSeekRouter and DeepSeekMoE against transformers' DeepseekV3TopkRouter / DeepseekV3MoE with
copied weights and a random correction bias (outputs, router logits, chosen experts and weights, the input's and
every parameter's gradient; float64 at 1e-10 with HF's float32 router casts widened to float64, float32 at 1e-5);
group-limited top-k with n_group > 1 and topk_group < n_group, norm_topk_prob on and off, shared experts; the bias
chooses but does not weigh; the sequence-wise balance loss against a torch transcription of Megatron's; the bias
update rule against NumPy; refusals."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.nn.moe_routing import DeepSeekMoE, DeepSeekRouter, sequence_balance_loss, updated_expert_bias

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds  # noqa: E402

DIM, HIDDEN = 8, 4


class _Wide:
    """``torch`` as HF's module sees it, with float32 read as float64: its router's float32 casts keep float64."""

    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def hf_config(E=8, k=2, n_group=4, topk_group=2, norm=True, shared=1, scale=2.5):
    cfg = DeepseekV3Config(hidden_size=DIM, moe_intermediate_size=HIDDEN, n_routed_experts=E, num_experts_per_tok=k,
                           n_group=n_group, topk_group=topk_group, norm_topk_prob=norm, n_shared_experts=shared,
                           routed_scaling_factor=scale, hidden_act="silu")
    cfg._experts_implementation = "eager"
    return cfg


def build(E=8, k=2, n_group=4, topk_group=2, norm=True, shared=1, scale=2.5, dtype=np.float64, seed=0):
    """Our DeepSeekMoE with N(0, 0.5) weights and a N(0, 0.1) correction bias, and HF's DeepseekV3MoE holding the
    same values."""
    ours = DeepSeekMoE(DIM, HIDDEN, E, k, n_shared_experts=shared, n_group=n_group, topk_group=topk_group,
                       norm_topk_prob=norm, routed_scaling_factor=scale, dtype=dtype)
    rng = np.random.default_rng(seed)
    with it.no_grad():
        for p in ours.parameters():
            p.copy_(it.tensor(rng.normal(0, 0.5, p.shape).astype(dtype)))
        ours.gate.e_score_correction_bias.copy_(it.tensor(rng.normal(0, 0.1, E).astype(dtype)))
    hf = hf_ds.DeepseekV3MoE(hf_config(E, k, n_group, topk_group, norm, shared, scale)).to(torch.from_numpy(
        np.zeros(0, dtype)).dtype)
    s = {n: torch.from_numpy(t.numpy().copy()) for n, t in ours.state_dict().items()}
    with torch.no_grad():
        hf.gate.weight.copy_(s["gate.weight"])
        hf.gate.e_score_correction_bias.copy_(s["gate.e_score_correction_bias"])
        for e in range(E):
            hf.experts.gate_up_proj[e].copy_(torch.cat([s[f"experts.{e}.gate_proj.weight"],
                                                        s[f"experts.{e}.up_proj.weight"]]))
            hf.experts.down_proj[e].copy_(s[f"experts.{e}.down_proj.weight"])
        if shared:
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(hf.shared_experts, name).weight.copy_(s[f"shared_experts.{name}.weight"])
    return ours, hf


def hf_grads(hf, E, shared):
    """HF's gradients under our names (the fused experts split)."""
    g = {"gate.weight": hf.gate.weight.grad}
    for e in range(E):
        gate, up = hf.experts.gate_up_proj.grad[e].chunk(2, 0)
        g.update({f"experts.{e}.gate_proj.weight": gate, f"experts.{e}.up_proj.weight": up,
                  f"experts.{e}.down_proj.weight": hf.experts.down_proj.grad[e]})
    for name in ("gate_proj", "up_proj", "down_proj"):
        if shared:  # (HF builds a zero-wide shared MLP for none)
            g[f"shared_experts.{name}.weight"] = getattr(hf.shared_experts, name).weight.grad
    return g


CASES = [dict(), dict(norm=False), dict(n_group=2, topk_group=1, k=3), dict(n_group=1, topk_group=1, k=3),
         dict(E=12, n_group=4, topk_group=3, k=4, shared=2), dict(shared=0, scale=1.0)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_matches_hf_deepseek_v3_moe(case, dtype, tol, monkeypatch):
    if dtype == np.float64:
        monkeypatch.setattr(hf_ds, "torch", _Wide())
    E = case.get("E", 8)
    ours, hf = build(dtype=dtype, **case)
    rng = np.random.default_rng(1)
    x_np, r = rng.normal(size=(2, 5, DIM)).astype(dtype), rng.normal(size=(2, 5, DIM)).astype(dtype)
    x = it.tensor(x_np, requires_grad=True)
    y = ours(x)
    (y * it.tensor(r)).sum().backward()
    xt = torch.tensor(x_np, requires_grad=True)
    logits, weights, indices = hf.gate(xt)
    yt = hf(xt)
    (yt * torch.from_numpy(r)).sum().backward()

    def err(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b.detach().numpy() if torch.is_tensor(b) else b, np.float64)
        assert a.shape == b.shape
        return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))

    np.testing.assert_array_equal(np.sort(ours.router_indices.numpy(), 1), np.sort(indices.numpy(), 1))
    plain = np.sort(np.argsort(-ours.router_probs.numpy(), 1)[:, :ours.top_k], 1)  # unbiased, ungrouped top-k
    assert (plain != np.sort(indices.numpy(), 1)).any()  # the bias (and the group limit) changed some choice
    route = ours.gate(it.tensor(x_np))
    order = np.argsort(indices.numpy(), 1)
    ours_order = np.argsort(route.indices.numpy(), 1)
    assert err(np.take_along_axis(route.weights.numpy(), ours_order, 1),
               np.take_along_axis(weights.detach().numpy(), order, 1)) < tol
    assert err(ours.router_logits.numpy(), logits) < tol
    assert err(y.numpy(), yt) < tol
    assert err(x.grad.numpy(), xt.grad) < tol
    expected = hf_grads(hf, E, case.get("shared", 1))
    names = [n for n, _ in ours.named_parameters()]
    assert set(names) == set(expected)
    for name, p in ours.named_parameters():
        want = expected[name]
        got = np.zeros(p.shape) if p.grad is None else p.grad.numpy()
        assert err(got, np.zeros(p.shape) if want is None else want) < tol, name
    assert ours.gate.e_score_correction_bias.grad is None


def test_bias_chooses_but_does_not_weigh():
    ours, _ = build(n_group=1, topk_group=1, k=2, norm=False, scale=1.0)
    x = it.tensor(np.random.default_rng(2).normal(size=(6, DIM)))
    with it.no_grad():
        ours.gate.e_score_correction_bias.copy_(it.tensor(np.zeros(8)))
        before = ours.gate(x)
        ours.gate.e_score_correction_bias[5] = 10.0  # expert 5 chosen by every token, with its unbiased score
        after = ours.gate(x)
    idx = after.indices.numpy()
    assert (idx[:, 0] == 5).all() and not (before.indices.numpy() == 5).all()
    scores = 1 / (1 + np.exp(-before.logits.numpy()))
    np.testing.assert_allclose(after.weights.numpy(), np.take_along_axis(scores, idx, 1), rtol=1e-14)
    np.testing.assert_allclose(after.probs.numpy(), scores, rtol=1e-14)


def test_group_limit_keeps_experts_of_the_best_groups():
    router = DeepSeekRouter(4, 8, 2, n_group=4, topk_group=1, dtype=it.float64)
    with it.no_grad():
        router.weight.copy_(it.tensor(np.zeros((8, 4))))
        # group scores (top-2 sums) rank group 1 first although expert 6 (group 3) has the largest score
        router.e_score_correction_bias.copy_(it.tensor(np.array([0, 0, 0.6, 0.6, 0, 0, 0.9, 0.0])))
    idx = router(it.tensor(np.zeros((3, 4)))).indices.numpy()
    np.testing.assert_array_equal(idx, [[2, 3]] * 3)  # the tie between 2 and 3: the lower index first


def megatron_seq_aux(scores, idx, batch, length, k):
    """Megatron-Core's sequence_load_balancing_loss_func (sigmoid scores normalised; rows batch-major here)."""
    E = scores.shape[1]
    probs = (scores / (scores.sum(-1, keepdim=True) + 1e-20)).reshape(batch, length, E).permute(1, 0, 2)
    routing = torch.nn.functional.one_hot(idx, E).sum(1).reshape(batch, length, E).permute(1, 0, 2)
    cost = routing.sum(0).double() / (length * k / E)
    return (cost * probs.mean(0)).sum(1).mean()


def test_sequence_balance_loss_matches_megatron():
    ours, _ = build()
    ours.seq_aux_loss_alpha = 0.25
    x_np = np.random.default_rng(4).normal(size=(3, 5, DIM))
    x = it.tensor(x_np, requires_grad=True)
    y = ours(x)
    scores = torch.tensor(ours.router_probs.numpy(), requires_grad=True)
    ref = megatron_seq_aux(scores, torch.tensor(ours.router_indices.numpy()), 3, 5, 2)
    np.testing.assert_allclose(ours.seq_aux_loss.item(), ref.item(), rtol=1e-12)
    ours.router_loss.backward()
    ref.backward()
    probs_grad = scores.grad.numpy()  # d loss / d scores, then through the sigmoid and the gate
    sig = ours.router_probs.numpy()
    want = 0.25 * (probs_grad * sig * (1 - sig)) @ ours.gate.weight.numpy()
    np.testing.assert_allclose(x.grad.numpy().reshape(-1, DIM), want, rtol=1e-10, atol=1e-14)
    assert y.shape == x.shape


def test_sequence_balance_loss_of_one_sequence():
    scores = it.tensor(np.random.default_rng(5).uniform(size=(6, 4)))
    idx = it.tensor(np.array([[0, 1]] * 6))
    f = np.array([2.0, 2.0, 0, 0])  # E / (k T) * 6 tokens for experts 0 and 1
    p = (scores.numpy() / scores.numpy().sum(1, keepdims=True)).mean(0)
    np.testing.assert_allclose(sequence_balance_loss(scores, idx, 1, 2).item(), (f * p).sum(), rtol=1e-14)


def test_updated_expert_bias_is_the_sign_rule():
    bias = np.array([[0.0, 0.1, -0.2, 0.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    load = np.array([[5, 3, 4, 4], [2, 2, 2, 2]])
    out = updated_expert_bias(bias, load, 0.01)
    np.testing.assert_array_equal(out, np.array([[-0.01, 0.11, -0.2, 0.0], [1.0, 1.0, 1.0, 1.0]], np.float32))
    assert out.dtype == np.float32


def test_expert_load_counts_training_forwards_only():
    ours, _ = build()
    x = it.tensor(np.random.default_rng(6).normal(size=(2, 3, DIM)))
    ours(x)
    ours(x)
    with it.no_grad():
        ours(x)
    assert ours.expert_load.sum() == 2 * 6 * 2
    np.testing.assert_array_equal(ours.expert_load, 2 * ours.tokens_per_expert)


def test_refusals():
    with pytest.raises(ValueError, match="n_group must divide num_experts"):
        DeepSeekRouter(4, 8, 2, n_group=3)
    with pytest.raises(ValueError, match="groups of at\nleast 2|at least 2"):
        DeepSeekRouter(4, 8, 2, n_group=8, topk_group=2)
    with pytest.raises(ValueError, match="topk_group must be in"):
        DeepSeekRouter(4, 8, 5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="bias_update_rate"):
        DeepSeekRouter(4, 8, 2, bias_update_rate=-1.0)
    with pytest.raises(ValueError, match="seq_aux_loss_alpha"):
        DeepSeekMoE(4, 3, 8, 2, seq_aux_loss_alpha=-0.1)


def test_built_on_meta_and_replayed_equals_the_eager_build():
    """The correction bias is a buffer its init fills: replaying the inits fills it (zero), as the weights."""
    from infini_train import backend
    from infini_train.nn.parallel.sharded_init import recording_inits, replay_inits

    it.manual_seed(5)
    eager = DeepSeekMoE(DIM, HIDDEN, 8, 2, n_group=4, topk_group=2)
    it.manual_seed(5)
    with backend.META, recording_inits() as calls:
        meta = DeepSeekMoE(DIM, HIDDEN, 8, 2, n_group=4, topk_group=2)
    meta.to_empty(device="cpu")
    meta.gate.e_score_correction_bias.array[...] = np.nan  # whatever the fresh storage held
    backend.manual_seed(5)
    replay_inits(calls, meta)
    for (name, a), (_, b) in zip(eager.state_dict().items(), meta.state_dict().items()):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=name)
    assert (meta.gate.e_score_correction_bias.numpy() == 0).all()
