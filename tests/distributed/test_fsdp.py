"""fully_shard (ZeRO-3) through its Python interface, in a world of one here and on 2 and 3 ranks under mpiexec:
training equals plain AdamW on one process; outside their module's forward the parameters hold placeholders that
refuse to be read; the autograd graph keeps no gathered parameters between forward and backward; gradient sync can
be deferred; the mixed-precision policy gathers and computes in its dtype; ``shard_group_fn`` shards some parameters of
a unit over a group of their own."""
import numpy as np
import pytest

import infini_train as it
from infini_train.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, ShardedError, fully_shard
from infini_train.distributed.fsdp.flat_shard import GATHERED
from infini_train.distributed.process_group import SingleProcessGroup
from tests.distributed.fsdp_cases import CONFIG, batches, build, reference_steps, sharded, sharded_steps
from tests.distributed.mpi_jobs import mpirun, needs_mpiexec, output

pytestmark = pytest.mark.layouts


def test_one_rank_trains_exactly_as_plain_adamw():
    data = batches(4)
    want = reference_steps(build(), data)
    got = sharded_steps(sharded(build()), data, 0, 1)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_parameters_are_placeholders_outside_forward_and_whole_inside_unsharded():
    model = sharded(build())
    reference = build()
    assert isinstance(model, FSDPModule) and type(model).__name__ == "FSDPGPT2"
    weight = model.transformer.h[0].mlp.c_fc.weight
    assert weight.shape == (4 * CONFIG.n_embd, CONFIG.n_embd) and weight.dtype == np.float32
    with pytest.raises(ShardedError, match="sharded across the data-parallel ranks"):
        weight.numpy()
    with model.unsharded():
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    with pytest.raises(ValueError, match="already sharded"):
        fully_shard(model)


def test_the_graph_holds_no_gathered_block_between_forward_and_backward():
    model = sharded(build())
    x, y = batches(1)[0]
    _, loss = model(it.tensor(x), it.tensor(y))
    root_spaces = {id(s) for s in model._fsdp.unit.spaces}
    assert {id(s) for s in GATHERED.values()} == root_spaces  # every block was resharded after its forward
    loss.backward()
    assert not GATHERED
    for block in model.transformer.h:
        assert all(v.grad is not None for s in block._fsdp.unit.spaces for v in s.shard_views.values())


def test_deferred_gradient_sync_accumulates_then_reduces_the_sum():
    data = batches(3)
    reference = build()
    for x, y in data:
        reference(it.tensor(x), it.tensor(y))[1].backward()
    model = sharded(build())
    for k, (x, y) in enumerate(data):
        model.set_requires_gradient_sync(k == len(data) - 1)
        model(it.tensor(x), it.tensor(y))[1].backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        shard = p.placement.flat_shard.shard_views[id(p)]
        np.testing.assert_allclose(shard.grad.numpy(), q.grad.numpy().reshape(-1), rtol=1e-5, atol=1e-7)


def test_mixed_precision_policy_gathers_in_param_dtype_and_keeps_float32_shards():
    policy = MixedPrecisionPolicy(param_dtype=it.bfloat16, reduce_dtype=it.float32)
    model = sharded(build(), mp_policy=policy)
    seen = []
    model.transformer.h[0].register_forward_hook(
        lambda m, args, out: seen.append((m.mlp.c_fc.weight.dtype, out.dtype)))
    x, y = batches(1)[0]
    logits, loss = model(it.tensor(x), it.tensor(y))
    loss.backward()
    assert seen == [(it.bfloat16, it.bfloat16)]
    reference_loss = build()(it.tensor(x), it.tensor(y))[1].item()
    np.testing.assert_allclose(loss.item(), reference_loss, rtol=2e-2)
    for space in model._fsdp.unit.spaces:
        assert space.shard.dtype == np.float32 and space.grad_shard.dtype == np.float32


def test_recomputed_blocks_gather_again_in_backward():
    from infini_train.models.recompute import set_recompute

    data = batches(2)
    want = reference_steps(set_recompute(build(), "block"), data)
    got = sharded_steps(set_recompute(sharded(build()), "block"), data, 0, 1)
    np.testing.assert_array_equal(got[0], want[0])


@needs_mpiexec
@pytest.mark.parametrize("ranks", [2, 3])
def test_fully_shard_on_several_ranks_matches_one_process(ranks):
    proc = mpirun(ranks, "worker_fsdp.py", timeout=180)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("fsdp ok") == ranks, output(proc)


@needs_mpiexec
def test_hybrid_sharding_over_two_replicas_of_two_matches_one_process_and_crosses_replicas_once():
    proc = mpirun(4, "worker_hsdp.py", timeout=180)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.count("hsdp ok") == 4, output(proc)


def test_a_forward_that_raises_leaves_the_next_forward_working():
    model = sharded(build())
    x, y = batches(1)[0]
    with pytest.raises(ValueError):
        model(it.tensor(x[:, :4]), it.tensor(y[:, :3]))  # targets of another shape
    _, loss = model(it.tensor(x), it.tensor(y))
    loss.backward()
    assert not GATHERED


def test_shard_group_fn_gives_some_parameters_a_space_over_their_own_group():
    """(What a block's experts get under expert parallelism: a space over their expert-data group in the block's
    unit, whose gradient sums are divided by the unit group's size.) In a world of one both groups are of one."""
    own, model = SingleProcessGroup(), build()
    mlps = {id(p) for block in model.transformer.h for p in block.mlp.parameters()}
    sharded(model, shard_group_fn=lambda p: own if id(p) in mlps else None)
    spaces = model.transformer.h[0]._fsdp.unit.spaces
    assert [space.group is own for space in spaces] == [False, True]
    assert {id(p) for p in spaces[1].params} == {id(p) for p in model.transformer.h[0].mlp.parameters()}
    assert [space.divide_by for space in spaces] == [1, 1]
    data = batches(3)
    want = reference_steps(build(), data)
    got = sharded_steps(model, data, 0, 1)
    np.testing.assert_array_equal(got[0], want[0])
