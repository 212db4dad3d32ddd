"""Split backward (autograd/split_backward.py): the input half (B) then the weight half (W) give every gradient a whole
backward gives, bitwise, for each op family with weights (linear, norms, embedding, LoRA, experts, autocast's casts,
recomputed blocks) and for whole pipeline chunks of GPT-2, LLaMA and Qwen3-MoE; B computes no weight gradient and
fires no weight hook; hooks, engine callbacks and the memory held between the halves behave as documented."""
import contextlib

import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.autograd import backward_input
from infini_train.autograd.engine import queue_callback
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama.model import Llama, LlamaConfig
from infini_train.models.llama.qwen3_moe import Qwen3Moe, Qwen3MoeConfig


def _grads(module, x):
    return [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in module.parameters() if p.grad is not None]


def _both_ways(make, shape, dtype=it.float32, context=None):
    """Gradients of ``make()`` applied to one input, whole and split (same seeds)."""
    out = []
    for split in (False, True):
        it.manual_seed(0)
        module = make()
        x = it.randn(*shape, dtype=dtype).requires_grad_(True)
        with context() if context else contextlib.nullcontext():
            y = module(x)
        g = it.randn(*y.shape, dtype=y.dtype)
        if split:
            weights = backward_input([y], [g], [x])
            assert x.grad is not None
            assert all(p.grad is None for p in module.parameters())
            weights.backward_weight()
        else:
            it.autograd.backward([y], [g])
        out.append(_grads(module, x))
    return out


def _lora_module():
    from infini_train.nn.lora import LoRALinear

    layer = LoRALinear(nn.Linear(8, 12), rank=4, alpha=8)
    with it.no_grad():
        layer.lora_B.weight.copy_(it.randn(*layer.lora_B.weight.shape))  # B starts at zero: give it values
    return layer


FAMILIES = {
    "linear": (lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)), (3, 5, 8)),
    "layer_norm": (lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), (4, 8)),
    "rms_norm": (lambda: nn.Sequential(nn.RMSNorm(8), nn.Linear(8, 8, bias=False)), (4, 8)),
    "lora": (_lora_module, (4, 8)),
    "experts": (lambda: nn.MoE(8, 12, num_experts=4, top_k=2, num_shared_experts=1), (6, 8)),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", [it.float32, it.float64])
def test_input_then_weight_half_equals_one_backward_bitwise(family, dtype):
    make, shape = FAMILIES[family]

    def build():
        return make().to(dtype)

    whole, split = _both_ways(build, shape, dtype)
    assert len(whole) == len(split) > 2
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a, b)


def test_autocast_casts_and_recomputed_blocks_split_bitwise():
    def block():
        return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    whole, split = _both_ways(block, (4, 8), context=lambda: it.autocast("cpu", dtype=it.bfloat16))
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a, b)

    class Recomputed(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = block()

        def forward(self, x):
            return it.autograd.checkpoint(self.inner, x)

    whole, split = _both_ways(Recomputed, (4, 8))
    for a, b in zip(whole, split):
        np.testing.assert_array_equal(a, b)


def test_embedding_and_a_graph_without_inputs_run_all_in_the_weight_half():
    it.manual_seed(0)
    emb, head = nn.Embedding(11, 8), nn.Linear(8, 11)
    ids = it.tensor(np.array([[1, 2, 3], [4, 5, 1]]))
    loss = nn.functional.cross_entropy(head(emb(ids)).reshape(-1, 11), ids.reshape(-1))
    weights = backward_input(loss, inputs=())
    assert emb.weight.grad is None and head.weight.grad is None
    weights.backward_weight()
    it.manual_seed(0)
    emb2, head2 = nn.Embedding(11, 8), nn.Linear(8, 11)
    nn.functional.cross_entropy(head2(emb2(ids)).reshape(-1, 11), ids.reshape(-1)).backward()
    for p, q in zip([emb.weight, head.weight, head.bias], [emb2.weight, head2.weight, head2.bias]):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


def _chunks(model, cut):
    L = model.config.num_layers
    return (model.pipeline_chunk(range(cut), True, False), model.pipeline_chunk(range(cut, L), False, True))


def _gpt2():
    return GPT2(GPT2Config(block_size=16, vocab_size=67, n_layer=4, n_head=2, n_embd=16))


def _llama():
    return Llama(LlamaConfig(vocab_size=67, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, intermediate_size=48,
                             max_seq_len=16, tie_word_embeddings=False, rope_scaling=None))


def _qwen3_moe():
    return Qwen3Moe(Qwen3MoeConfig(vocab_size=67, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=8,
                                   intermediate_size=48, moe_intermediate_size=16, num_experts=6,
                                   num_experts_per_tok=2, mlp_only_layers=[1], max_seq_len=16,
                                   tie_word_embeddings=True))


def _parts(out):
    return list(out) if isinstance(out, tuple) else [out]


def _leaves(parts):
    return [p.detach().requires_grad_(True) for p in parts]


def _packed(parts):
    return parts[0] if len(parts) == 1 else tuple(parts)


@pytest.mark.parametrize("make", [_gpt2, _llama, _qwen3_moe], ids=["gpt2", "llama", "qwen3_moe"])
def test_whole_pipeline_chunks_split_bitwise(make):
    rng = np.random.default_rng(0)
    ids = it.tensor(rng.integers(0, 67, (2, 16)))
    targets = it.tensor(rng.integers(0, 67, (2, 16)))
    results = []
    for split in (False, True):
        it.manual_seed(0)
        first, last = _chunks(make(), 2)
        sent = _parts(first(ids, None))
        received = _leaves(sent)
        _, loss = last(_packed(received), targets)
        roots = [t for t in sent if t.requires_grad]
        if split:
            held = backward_input(loss, inputs=[t for t in received if t.requires_grad])
            assert all(p.grad is None for p in last.parameters())
            assert held.held_bytes > 0
            grads = [t.grad for t, s in zip(received, sent) if s.requires_grad]
            first_half = backward_input(roots, grads, ())
            held.backward_weight()
            first_half.backward_weight()
        else:
            loss.backward()
            it.autograd.backward(roots, [t.grad for t, s in zip(received, sent) if s.requires_grad])
        results.append({n: p.grad.numpy().copy() for chunk in (first, last) for n, p in chunk.named_parameters()
                        if p.grad is not None})
    whole, split = results
    assert whole.keys() == split.keys() and len(whole) > 8
    for name in whole:
        np.testing.assert_array_equal(whole[name], split[name], err_msg=name)


def test_hooks_fire_in_their_half_and_callbacks_wait_for_the_weight_half():
    it.manual_seed(0)
    layer = nn.Linear(4, 4)
    x = it.randn(2, 4).requires_grad_(True)
    events = []
    layer.weight.register_post_accumulate_grad_hook(lambda p: events.append("weight hook"))
    y = layer(x)
    y.register_hook(lambda g: events.append("output hook") or g * 2)
    x.register_hook(lambda g: events.append("input hook") or queue_callback(lambda: events.append("callback")))
    weights = backward_input(y.sum(), inputs=[x])
    assert events == ["output hook", "input hook"]
    weights.backward_weight()
    assert events == ["output hook", "input hook", "weight hook", "callback"]
    np.testing.assert_array_equal(layer.bias.grad.numpy(), np.full(4, 4.0, np.float32))  # the hook's doubled grad
    assert weights.held_bytes == 0  # nothing is kept once the weight half ran
    with pytest.raises(RuntimeError, match="already ran"):
        weights.backward_weight()


def test_inputs_must_require_grad():
    x = it.randn(2, 3)
    w = it.randn(3, 3).requires_grad_(True)
    with pytest.raises(RuntimeError, match="input 0 does not require grad"):
        backward_input((x @ w).sum(), inputs=[x])
