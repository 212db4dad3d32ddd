"""Tensor and sequence parallelism: real MPI jobs of 1, 2 and 4 ranks (worker_tensor_parallel.py compares every
mapping, layer, the vocabulary-parallel loss and column -> row chains with their single-device equivalents), a world
of one without a launcher, and in-process checks on a group of one (identity mappings, layers equal to nn.Linear /
nn.Embedding / cross_entropy) and of the errors raised before any collective runs."""
import os
import re

import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.distributed.process_group import ProcessGroup, SingleProcessGroup
from infini_train.nn import functional as F
from infini_train.nn.parallel import (
    ColumnParallelLinear,
    ParallelParameter,
    RowParallelLinear,
    ShardSpec,
    VocabParallelEmbedding,
    all_reduce_sequence_parallel_grads,
    copy_to_tensor_parallel_region,
    whole_from_shards,
    gather_from_sequence_parallel_region,
    gather_from_tensor_parallel_region,
    mark_sequence_parallel,
    reduce_from_tensor_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
    shard_from_whole,
    vocab_parallel_cross_entropy,
)
from tests.distributed.mpi_jobs import HERE, assert_every_rank_checked, mpirun, needs_mpiexec, output, python

pytestmark = pytest.mark.layouts

ONE = SingleProcessGroup()
PAIR_RANK_1 = ProcessGroup([0, 1], 1)  # shape checks only: the errors below are raised before any collective


@needs_mpiexec
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_tensor_parallel_layers_match_one_device_on_mpi(ranks):
    proc = mpirun(ranks, "worker_tensor_parallel.py", timeout=300)
    assert proc.returncode == 0, output(proc)
    assert_every_rank_checked(proc, "TP OK", ranks, at_least=151)


def test_tensor_parallel_in_a_world_of_one_without_a_launcher():
    proc = python(os.path.join(HERE, "worker_tensor_parallel.py"), timeout=120)
    assert proc.returncode == 0, output(proc)
    assert re.fullmatch(r"rank 0 TP OK \d+", proc.stdout.strip()), output(proc)


MAPPINGS = [copy_to_tensor_parallel_region, reduce_from_tensor_parallel_region, scatter_to_tensor_parallel_region,
            gather_from_tensor_parallel_region, scatter_to_sequence_parallel_region,
            gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region]


@pytest.mark.parametrize("mapping", MAPPINGS, ids=lambda f: f.__name__)
def test_every_mapping_is_a_view_and_passes_the_gradient_in_a_group_of_one(mapping):
    x = it.tensor(np.arange(24.0, dtype=np.float32).reshape(2, 3, 4), requires_grad=True)
    y = mapping(x, ONE)
    assert y.tolist() == x.tolist() and np.shares_memory(y.numpy(), x.numpy())
    g = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
    y.backward(it.tensor(g))
    assert np.array_equal(x.grad.numpy(), g)


def test_layers_in_a_group_of_one_equal_the_full_layers():
    it.manual_seed(0)
    fc, proj, emb = nn.Linear(6, 12), nn.Linear(12, 6), nn.Embedding(11, 6)
    it.manual_seed(0)
    tp_fc, tp_proj, tp_emb = ColumnParallelLinear(6, 12, group=ONE, blocks=3), RowParallelLinear(12, 6, group=ONE), \
        VocabParallelEmbedding(11, 6, group=ONE, pad_to_multiple_of=4)
    assert np.array_equal(tp_fc.weight.numpy(), fc.weight.numpy())  # same RNG stream as nn.Linear
    assert np.array_equal(tp_proj.bias.numpy(), proj.bias.numpy())
    assert np.array_equal(tp_emb.weight.numpy()[:11], emb.weight.numpy()) and not tp_emb.weight.numpy()[11:].any()
    assert tp_emb.padded_num_embeddings == 12 and tp_emb.vocab_range == (0, 12)
    ids = it.tensor([[1, 10, 3], [0, 0, 7]])
    ref = proj(F.gelu(fc(emb(ids))))
    out = tp_proj(F.gelu(tp_fc(tp_emb(ids))))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    ref.sum().backward()
    out.sum().backward()
    for tp_p, p in [(tp_fc.weight, fc.weight), (tp_proj.weight, proj.weight), (tp_proj.bias, proj.bias)]:
        np.testing.assert_allclose(tp_p.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-7)
    emb_grad = whole_from_shards(tp_emb.weight.grad, tp_emb.weight.placement.tensor_shard, ONE)
    np.testing.assert_allclose(emb_grad, emb.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert not tp_emb.weight.grad.numpy()[11:].any()


def test_vocab_parallel_cross_entropy_in_a_group_of_one_equals_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 10)).astype(np.float32)
    padded = np.concatenate([logits, np.full((6, 2), 50.0, np.float32)], 1)  # two padding columns, never counted
    target = it.tensor([0, 9, -100, 4, 4, 1])
    ref_in, x = it.tensor(logits, requires_grad=True), it.tensor(padded, requires_grad=True)
    ref = F.cross_entropy(ref_in, target, reduction="none")
    losses = vocab_parallel_cross_entropy(x, target, ONE, vocab_size=10)
    np.testing.assert_allclose(losses.numpy(), ref.numpy(), rtol=1e-5)
    assert losses.dtype == it.float32 and losses.numpy()[2] == 0
    ref.mean().backward()  # the mean over the 6 tokens, ignored one included, as torch's 'none' then mean
    losses.mean().backward()
    np.testing.assert_allclose(x.grad.numpy()[:, :10], ref_in.grad.numpy(), rtol=1e-5, atol=1e-7)
    assert not x.grad.numpy()[:, 10:].any()
    half = vocab_parallel_cross_entropy(it.tensor(padded.astype(np.float64)), target, ONE, vocab_size=10)
    assert half.dtype == it.float64


def test_parallel_parameters_carry_their_spec_through_to_and_state_dict():
    layer = RowParallelLinear(4, 3, group=ONE, sequence_parallel=True)
    assert isinstance(layer.weight, ParallelParameter) and layer.weight.placement.tensor_shard == ShardSpec(1)
    assert layer.bias.placement.tensor_shard is None and layer.bias.placement.sequence_parallel
    assert not layer.weight.placement.sequence_parallel
    weight = layer.weight
    layer.to(it.float64)
    assert layer.weight is weight and weight.placement.tensor_shard == ShardSpec(1) and weight.dtype == it.float64
    assert sorted(layer.state_dict()) == ["bias", "weight"]


def test_mark_sequence_parallel_keeps_the_memory_and_ties():
    ln = nn.LayerNorm(4)
    weight = ln.weight
    mark_sequence_parallel(ln)
    assert ln.weight.placement.sequence_parallel and ln.bias.placement.sequence_parallel
    assert isinstance(ln.weight, ParallelParameter)
    assert np.shares_memory(ln.weight.numpy(), weight.numpy())
    tied = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 2)})
    tied["b"].weight = tied["a"].weight
    mark_sequence_parallel(tied)
    assert tied["a"].weight is tied["b"].weight and tied["a"].weight.placement.sequence_parallel
    ln(it.ones(2, 4)).sum().backward()
    before = ln.weight.grad.numpy().copy()
    all_reduce_sequence_parallel_grads(ln, ONE)  # a group of one: nothing to sum
    assert np.array_equal(ln.weight.grad.numpy(), before)


def test_mark_sequence_parallel_keeps_the_experts_routed():
    """A mixture of experts under sequence parallelism: its experts stay ``routed`` (fully_shard reduces a unit
    holding them at the end of backward; a unit that lost it deadlocked ZeRO-3 x TP2 + SP x EP2)."""
    moe = nn.MoE(8, 16, num_experts=4, top_k=1)
    mark_sequence_parallel(moe)
    assert all(p.placement.sequence_parallel for p in moe.parameters())
    assert all(p.placement.routed for p in moe.experts.parameters()) and not moe.gate.weight.placement.routed


def test_shard_spec_round_trips_in_a_group_of_one():
    full = np.arange(30.0).reshape(5, 6)
    spec = ShardSpec(1, blocks=3)
    assert np.array_equal(whole_from_shards(shard_from_whole(full, spec, 0, 1, np), spec, ONE), full)
    padded = ShardSpec(0, whole_size=5, pad_to_multiple_of=4)
    shard = shard_from_whole(full, padded, 0, 1, np)
    assert shard.shape == (8, 6) and not shard[5:].any()
    assert np.array_equal(whole_from_shards(shard, padded, ONE), full)
    # rank 1 of 2, three blocks: its part of each block, in block order
    rows = np.arange(12.0)
    assert shard_from_whole(rows, ShardSpec(0, 3), 1, 2, np).tolist() == [2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
    assert shard_from_whole(np.arange(5.0), ShardSpec(0, whole_size=5), 1, 2, np).tolist() == [3.0, 4.0, 0.0]


@pytest.mark.parametrize("build, needle", [
    (lambda: ColumnParallelLinear(4, 10, group=ProcessGroup([0, 1, 2, 3], 0)),
     "ColumnParallelLinear: expected out_features divisible by the tensor-parallel group size 4, got out_features=10 "
     "(remainder 2)\nHINT: choose out_features a multiple of 4"),
    (lambda: ColumnParallelLinear(4, 18, group=ProcessGroup([0, 1, 2, 3], 0), blocks=3),
     "group size 4 x blocks 3 = 12, got out_features=18 (remainder 6)\nHINT: choose out_features a multiple of 12 "
     "(for attention: n_head divisible by the tensor-parallel size)"),
    (lambda: RowParallelLinear(9, 4, group=PAIR_RANK_1),
     "RowParallelLinear: expected in_features divisible by the tensor-parallel group size 2, got in_features=9 "
     "(remainder 1)\nHINT"),
    (lambda: scatter_to_tensor_parallel_region(it.zeros(3, 5), PAIR_RANK_1),
     "scatter_to_tensor_parallel_region: expected dim 1 of length divisible by the tensor-parallel group size 2, got a "
     "tensor of shape (3, 5) (length 5, remainder 1)\nHINT: make that length a multiple of 2"),
    (lambda: scatter_to_sequence_parallel_region(it.zeros(2, 7, 4), PAIR_RANK_1),
     "scatter_to_sequence_parallel_region: expected dim 1 of length divisible by the tensor-parallel group size 2"),
    (lambda: reduce_scatter_to_sequence_parallel_region(it.zeros(2, 7, 4), PAIR_RANK_1),
     "reduce_scatter_to_sequence_parallel_region: expected dim 1 of length divisible by the tensor-parallel group "
     "size 2, got a tensor of shape (2, 7, 4) (length 7, remainder 1)"),
    (lambda: gather_from_sequence_parallel_region(it.zeros(2, 4), ONE, dim=2),
     "gather_from_sequence_parallel_region: expected dim in [-2, 2) for a 2-d tensor, got dim=2\nHINT"),
    (lambda: shard_from_whole(np.zeros((7, 2)), ShardSpec(0), 0, 2, np),
     "shard_from_whole: expected dim 0 of length divisible by group size x blocks = 2 x 1 = 2, got an array of shape "
     "(7, 2) (length 7)\nHINT"),
    (lambda: shard_from_whole(np.zeros((9, 2)), ShardSpec(0, whole_size=7), 0, 2, np),
     "shard_from_whole: expected dim 0 of length whole_size=7 (or 8 padded), got an array of shape (9, 2)\nHINT"),
    (lambda: VocabParallelEmbedding(10, 4, group=ONE)(it.tensor([3, 10])),
     "VocabParallelEmbedding: expected ids in [0, 10), got id 10\nHINT"),
    (lambda: vocab_parallel_cross_entropy(it.zeros(3, 4), it.tensor([0, 1, 5]), ONE, 5),
     "vocab_parallel_cross_entropy: expected 0 < vocab_size <= group size x V_local = 1 x 4, got vocab_size=5\nHINT"),
    (lambda: vocab_parallel_cross_entropy(it.zeros(3, 4), it.tensor([0, 1, 3]), ONE, 3),
     "vocab_parallel_cross_entropy: expected target values in [0, 3) or ignore_index=-100, got target value 3\nHINT"),
    (lambda: vocab_parallel_cross_entropy(it.zeros(3, 4), it.tensor([0, 1]), ONE, 4),
     "vocab_parallel_cross_entropy: expected target of shape (3,) for logits of shape (3, 4), got target of shape "
     "(2,)"),
])
def test_errors_name_what_was_expected_and_received(build, needle):
    with pytest.raises(ValueError) as info:
        build()
    assert needle in str(info.value)


def test_vocab_parallel_embedding_keeps_padding_idx_out_of_the_gradient():
    """As torch's nn.Embedding(padding_idx=...): the row is looked up, but gets no gradient."""
    import torch

    whole = nn.Embedding(6, 3, padding_idx=2)
    split = VocabParallelEmbedding.from_embedding(whole, ONE)
    ref = torch.nn.Embedding(6, 3, padding_idx=2)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(whole.weight.numpy()))
    ids = [[2, 0, 2, 5], [1, 2, 4, 0]]
    out = split(it.tensor(ids))
    expected = ref(torch.tensor(ids))
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy())
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    np.testing.assert_allclose(split.weight.grad.numpy(), ref.weight.grad.numpy(), rtol=1e-6)
    assert not split.weight.grad.numpy()[2].any() and split.weight.grad.numpy()[0].any()
