"""it.nn.moe: the dropless / capacity-limited MoE layer against a dense torch loop over experts (forward and every
gradient in float64: ties in the router, an idle expert, top_k == num_experts, top_k == 1, shared experts, capacity
drops), against transformers' Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock with the same
weights (outputs, router logits, load_balancing_loss_func, gradients), and the router z-loss against torch."""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn

transformers = pytest.importorskip("transformers")
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func  # noqa: E402
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

# Mixtral's checkpoint names -> ours (and HF Qwen3-MoE's): block_sparse_moe.experts.{i}.w1/w3/w2 are the
# gate / up / down projections; block_sparse_moe.gate.weight is the router (gate.weight) as in Qwen3-MoE.
MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def from_mixtral_names(state):
    out = {}
    for key, value in state.items():
        parts = key.replace("block_sparse_moe.", "").split(".")
        out[".".join(MIXTRAL_EXPERT_NAMES.get(p, p) for p in parts)] = value
    return out


def build(dim=6, hidden=5, E=4, k=2, dtype=it.float64, seed=0, scale=0.5, **kw):
    """An MoE with N(0, scale) weights, and torch leaf copies of them by name."""
    moe = nn.MoE(dim, hidden, E, k, dtype=dtype, **kw)
    rng = np.random.default_rng(seed)
    with it.no_grad():
        for p in moe.parameters():
            p.copy_(it.tensor(rng.normal(0, scale, p.shape).astype(dtype)))
    return moe, torch_copies(moe)


def torch_copies(moe):
    return {n: torch.tensor(p.numpy(), requires_grad=True) for n, p in moe.named_parameters()}


def swiglu(t, prefix, x):
    return torch.nn.functional.silu(x @ t[prefix + "gate_proj.weight"].T) * (x @ t[prefix + "up_proj.weight"].T) \
        @ t[prefix + "down_proj.weight"].T


def dense_reference(t, x, E, k, norm=True, capacity=None, shared=False, shared_gate=False):
    """Every expert over every token, weighted by its routing weight (zero where not chosen or dropped);
    ties broken lowest index first (a stable descending sort). Returns (out, logits, aux, z, kept mask)."""
    logits = x @ t["gate.weight"].T
    probs = torch.softmax(logits, -1)
    idx = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    w = probs.gather(1, idx)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    kept = torch.zeros(x.shape[0], E, dtype=torch.bool)
    for e in range(E):
        mask = idx == e                                    # (N, k): at most one choice per token
        hit = mask.any(1)
        if capacity is not None:
            hit = hit & (torch.cumsum(hit.long(), 0) <= capacity)  # the first `capacity` tokens in token order
        kept[:, e] = hit
        weight = (w * mask).sum(1) * hit
        out = out + weight[:, None] * swiglu(t, f"experts.{e}.", x)
    if shared:
        s = swiglu(t, "shared_expert.", x)
        out = out + (torch.sigmoid(x @ t["shared_expert_gate.weight"].T) * s if shared_gate else s)
    counts = torch.nn.functional.one_hot(idx, E).sum((0, 1)).to(probs.dtype)
    aux = E * (counts / x.shape[0] * probs.mean(0)).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    return out, logits, aux, z, kept


def grad_np(p):
    return np.zeros(p.shape) if p.grad is None else p.grad.numpy()


def check_against_dense(moe, t, x_np, norm=True, capacity=None, shared=False, shared_gate=False, rtol=1e-6):
    E, k = moe.num_experts, moe.top_k
    r = np.random.default_rng(7).normal(size=x_np.shape)
    x = it.tensor(x_np, requires_grad=True)
    y = moe(x)
    ((y * it.tensor(r)).sum() + moe.router_loss).backward()
    xt = torch.tensor(x_np.reshape(-1, moe.dim), requires_grad=True)
    out, logits, aux, z, kept = dense_reference(t, xt, E, k, norm, capacity, shared, shared_gate)
    (out.reshape(x_np.shape) * torch.tensor(r)).sum().add(moe.aux_loss_coef * aux + moe.z_loss_coef * z).backward()
    close = dict(rtol=rtol, atol=1e-12)
    assert y.shape == x.shape
    np.testing.assert_allclose(y.numpy(), out.detach().numpy().reshape(x_np.shape), **close)
    np.testing.assert_allclose(moe.router_logits.numpy(), logits.detach().numpy(), **close)
    np.testing.assert_allclose(moe.aux_loss.item(), aux.item(), **close)
    np.testing.assert_allclose(moe.z_loss.item(), z.item(), **close)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy().reshape(x_np.shape), **close)
    for name, p in moe.named_parameters():
        np.testing.assert_allclose(grad_np(p), t[name].grad.numpy(), err_msg=name, **close)
    np.testing.assert_array_equal(moe.tokens_per_expert, kept.sum(0).numpy())
    assert moe.dropped_tokens == xt.shape[0] * k - int(kept.sum())
    return kept


COEFS = dict(aux_loss_coef=0.3, z_loss_coef=0.05)


@pytest.mark.parametrize("E,k,norm", [(4, 2, True), (4, 2, False), (5, 5, True), (4, 1, False), (4, 1, True),
                                      (8, 3, True)])
def test_dropless_matches_dense_loop(E, k, norm):
    moe, t = build(E=E, k=k, norm_topk_prob=norm, seed=E + k, **COEFS)
    x = np.random.default_rng(1).normal(size=(2, 7, 6))
    check_against_dense(moe, t, x, norm)
    assert moe.dropped_tokens == 0 and moe.tokens_per_expert.sum() == 14 * k
    assert moe.tokens_per_expert.dtype.kind == "i" and isinstance(moe.dropped_tokens, int)


def test_ties_in_router_pick_lowest_index():
    """Experts 1 and 2 have equal gate rows (and 0 and 4); small dyadic values keep the logits exactly equal."""
    moe, _ = build(dim=4, E=5, k=2, **COEFS)
    rng = np.random.default_rng(3)
    gate = rng.integers(-4, 5, (5, 4)) / 4
    gate[2], gate[4] = gate[1], gate[0]
    with it.no_grad():
        moe.gate.weight.copy_(it.tensor(gate))
    t = torch_copies(moe)
    x = rng.integers(-4, 5, (24, 4)) / 4
    route = moe.gate(it.tensor(x))
    probs, idx = route.probs.numpy(), route.indices.numpy()
    assert (probs[:, 1] == probs[:, 2]).all() and (probs[:, 0] == probs[:, 4]).all()
    has = [(idx == e).any(1) for e in range(5)]
    assert (has[2] <= has[1]).all() and (has[4] <= has[0]).all()  # a split tie goes to the lower index
    assert (has[1] & ~has[2]).any() and (has[0] & ~has[4]).any()  # and this data splits both ties
    both = has[1] & has[2]
    assert both.any() and (np.argmax(idx[both] == 1, 1) < np.argmax(idx[both] == 2, 1)).all()  # lower first
    check_against_dense(moe, t, x)


def test_expert_without_tokens():
    moe, _ = build(E=4, k=2, **COEFS)
    with it.no_grad():  # x > 0 below, so expert 3's logit is far below expert 0's for every token
        moe.gate.weight[3] = moe.gate.weight[0] - 50.0
    t = torch_copies(moe)
    x = np.random.default_rng(4).uniform(0.1, 1.0, (10, 6))
    check_against_dense(moe, t, x)
    assert moe.tokens_per_expert[3] == 0 and moe.tokens_per_expert.sum() == 20
    assert moe.experts[3].up_proj.weight.grad is None  # never ran: no graph reaches it


@pytest.mark.parametrize("shared_gate", [False, True])
def test_shared_experts(shared_gate):
    moe, t = build(E=4, k=2, num_shared_experts=2, shared_expert_gate=shared_gate, **COEFS)
    assert moe.shared_expert.up_proj.weight.shape == (10, 6)  # 2 shared experts of hidden 5, fused
    check_against_dense(moe, t, np.random.default_rng(5).normal(size=(3, 4, 6)), shared=True, shared_gate=shared_gate)
    moe, _ = build(num_shared_experts=1, shared_hidden_dim=3)
    assert moe.shared_expert.down_proj.weight.shape == (6, 3) and "shared_expert_gate" not in dict(moe.named_modules())


def reference_drops(idx, E, capacity):
    """Per (token, choice): kept if fewer than `capacity` earlier tokens went to the same expert."""
    seen, keep = np.zeros(E, int), np.zeros(idx.shape, bool)
    for n in range(idx.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[n, j]
            keep[n, j] = seen[e] < capacity
            seen[e] += 1
    return keep


@pytest.mark.parametrize("factor,k", [(1.0, 2), (0.5, 2), (0.3, 1), (1.25, 3), (4.0, 2)])
def test_capacity_factor_drops(factor, k):
    E, N = 4, 16
    moe, t = build(E=E, k=k, capacity_factor=factor, seed=11, **COEFS)
    with it.no_grad():  # unbalance the router so that drops happen
        moe.gate.weight[0] = moe.gate.weight[0] + 1.0
    t = torch_copies(moe)
    x = np.random.default_rng(6).uniform(-0.2, 1.0, (N, 6))
    capacity = math.ceil(factor * N * k / E)
    assert moe.capacity(N) == capacity
    kept = check_against_dense(moe, t, x, capacity=capacity)
    idx = moe.gate(it.tensor(x)).indices.numpy()
    keep = reference_drops(idx, E, capacity)
    expected = np.array([keep[idx == e].sum() for e in range(E)])
    np.testing.assert_array_equal(moe.tokens_per_expert, expected)
    assert moe.dropped_tokens == int((~keep).sum())
    assert (moe.tokens_per_expert <= capacity).all()
    np.testing.assert_array_equal(kept.numpy()[np.arange(N)[:, None], idx], keep)
    if factor <= 1.0:
        assert moe.dropped_tokens > 0
    if factor >= 4.0:
        assert moe.dropped_tokens == 0


def test_capacity_dropped_token_contributes_zero():
    moe, _ = build(E=2, k=1, capacity_factor=0.5, norm_topk_prob=False)  # capacity ceil(0.5 * 4 / 2) = 1
    with it.no_grad():
        moe.gate.weight.copy_(it.tensor(np.array([[1.0] * 6, [-1.0] * 6])))
    x = np.abs(np.random.default_rng(8).normal(size=(4, 6))) + 0.1  # all tokens prefer expert 0
    y = moe(it.tensor(x)).numpy()
    np.testing.assert_array_equal(moe.tokens_per_expert, [1, 0])
    assert moe.dropped_tokens == 3
    assert np.abs(y[0]).sum() > 0 and (y[1:] == 0).all()


def test_z_loss_value_and_gradient():
    moe, t = build(E=5, k=2, z_loss_coef=1.0)
    x_np = np.random.default_rng(9).normal(size=(2, 3, 6))
    x = it.tensor(x_np, requires_grad=True)
    moe(x)
    moe.z_loss.backward()
    xt = torch.tensor(x_np, requires_grad=True)
    z = torch.logsumexp(xt @ t["gate.weight"].T, -1).pow(2).mean()
    z.backward()
    np.testing.assert_allclose(moe.z_loss.item(), z.item(), rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(moe.gate.weight.grad.numpy(), t["gate.weight"].grad.numpy(), rtol=1e-10)
    assert moe.z_loss.dtype == it.float64 and moe.router_loss.item() == pytest.approx(z.item(), rel=1e-12)


# ------------------------------------------------------------------------------------------ transformers' blocks
def hf_block(kind, D=16, I=8, E=6, k=2, norm=True):
    torch.manual_seed(0)
    if kind == "mixtral":
        config = transformers.MixtralConfig(hidden_size=D, intermediate_size=I, num_local_experts=E,
                                            num_experts_per_tok=k, router_jitter_noise=0.0)
        block = MixtralSparseMoeBlock(config)
    else:
        cls, conf = ((Qwen3MoeSparseMoeBlock, transformers.Qwen3MoeConfig) if kind == "qwen3_moe"
                     else (Qwen2MoeSparseMoeBlock, transformers.Qwen2MoeConfig))
        config = conf(hidden_size=D, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k,
                      norm_topk_prob=norm, shared_expert_intermediate_size=12)
        block = cls(config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    return block


def checkpoint_state(block, kind):
    """The block's weights under the names its checkpoints use on disk (HF fuses gate/up into 3-D in memory)."""
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    I = down.shape[2]
    names = ("w1", "w3", "w2") if kind == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    prefix = "block_sparse_moe." if kind == "mixtral" else ""
    state = {prefix + "gate.weight": block.gate.weight.detach()}
    for e in range(gate_up.shape[0]):
        for name, w in zip(names, (gate_up[e, :I], gate_up[e, I:], down[e])):
            state[f"{prefix}experts.{e}.{name}.weight"] = w
    if kind == "qwen2_moe":
        state.update({f"shared_expert.{n}": p.detach() for n, p in block.shared_expert.named_parameters()})
        state["shared_expert_gate.weight"] = block.shared_expert_gate.weight.detach()
    return {n: it.tensor(v.numpy().copy()) for n, v in state.items()}


@pytest.mark.parametrize("kind,k,norm", [("qwen3_moe", 2, True), ("qwen3_moe", 3, False), ("mixtral", 2, True),
                                         ("qwen2_moe", 2, False)])
def test_matches_transformers_block(kind, k, norm):
    D, I, E = 16, 8, 6
    block = hf_block(kind, D, I, E, k, norm)
    shared = dict(num_shared_experts=1, shared_hidden_dim=12, shared_expert_gate=True) if kind == "qwen2_moe" else {}
    moe = nn.MoE(D, I, E, k, norm_topk_prob=norm, aux_loss_coef=0.1, **shared)
    state = checkpoint_state(block, kind)
    moe.load_state_dict(from_mixtral_names(state) if kind == "mixtral" else state, strict=True)

    rng = np.random.default_rng(10)
    x_np, r = rng.normal(size=(2, 5, D)).astype(np.float32), rng.normal(size=(2, 5, D)).astype(np.float32)
    x = it.tensor(x_np, requires_grad=True)
    y = moe(x)
    ((y * it.tensor(r)).sum() + moe.router_loss).backward()

    xt = torch.tensor(x_np, requires_grad=True)
    yt = block(xt)
    logits = block.gate(xt.view(-1, D))[0]
    aux = load_balancing_loss_func((logits,), E, k)
    ((yt * torch.tensor(r)).sum() + 0.1 * aux).backward()

    close = dict(rtol=1e-5, atol=1e-6)
    assert y.dtype == it.float32
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), **close)
    np.testing.assert_allclose(moe.router_logits.numpy(), logits.detach().numpy(), **close)
    np.testing.assert_allclose(moe.aux_loss.item(), aux.item(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), **close)
    np.testing.assert_allclose(moe.gate.weight.grad.numpy(), block.gate.weight.grad.numpy(), **close)
    g_gate_up, g_down = block.experts.gate_up_proj.grad.numpy(), block.experts.down_proj.grad.numpy()
    for e, ex in enumerate(moe.experts):
        for ours, theirs in ((ex.gate_proj, g_gate_up[e, :I]), (ex.up_proj, g_gate_up[e, I:]),
                             (ex.down_proj, g_down[e])):
            np.testing.assert_allclose(grad_np(ours.weight), theirs, err_msg=f"expert {e}", **close)
    if kind == "qwen2_moe":
        np.testing.assert_allclose(moe.shared_expert_gate.weight.grad.numpy(),
                                   block.shared_expert_gate.weight.grad.numpy(), **close)
        np.testing.assert_allclose(moe.shared_expert.up_proj.weight.grad.numpy(),
                                   block.shared_expert.up_proj.weight.grad.numpy(), **close)


def test_router_matches_hf_router_and_dtype():
    block = hf_block("qwen3_moe", k=2, norm=False)
    router = nn.Router(16, 6, 2, norm_topk_prob=False)
    router.load_state_dict({"weight": it.tensor(block.gate.weight.detach().numpy())})
    x_np = np.random.default_rng(12).normal(size=(7, 16)).astype(np.float32)
    logits, probs, weights, indices = router(it.tensor(x_np))
    hf_logits, hf_weights, hf_indices = block.gate(torch.tensor(x_np))
    np.testing.assert_allclose(logits.numpy(), hf_logits.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weights.numpy(), hf_weights.detach().numpy(), rtol=1e-6)
    np.testing.assert_array_equal(indices.numpy(), hf_indices.numpy())
    assert probs.dtype == it.float32 and indices.dtype == it.int64
    half = router.to(it.bfloat16)(it.tensor(x_np).to(it.bfloat16))
    assert half.logits.dtype == it.bfloat16 and half.probs.dtype == it.float32 and half.weights.dtype == it.bfloat16


def test_shapes_errors_and_metrics_reset():
    moe, _ = build(E=4, k=2, dtype=it.float32)
    assert moe.aux_loss is None and moe.router_loss is None
    assert moe(it.randn(5, 6)).shape == (5, 6) and moe.tokens_per_expert.sum() == 10
    assert moe(it.randn(1, 3, 6)).shape == (1, 3, 6) and moe.tokens_per_expert.sum() == 6
    with pytest.raises(ValueError, match="top_k"):
        nn.Router(4, 3, 4)
    with pytest.raises(ValueError, match="capacity_factor"):
        nn.MoE(4, 4, 2, 1, capacity_factor=0)
    with pytest.raises(ValueError, match=r"\(\.\.\., 6\)"):
        moe(it.randn(2, 5))
    assert it.nn.moe.MoE is nn.MoE and "experts.3.down_proj.weight" in moe.state_dict()
