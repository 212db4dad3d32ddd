"""DistributedDataParallel.register_comm_hook with torch's default hooks and DDP.join() for uneven inputs, on two ranks
under mpiexec (worker_ddp_hooks.py checks the reduced gradients against one-process ones), and the hook API in a world
of one (GradBucket's methods, the Future the hooks return, the registration errors)."""
import numpy as np
import pytest

import infini_train as it
from infini_train import nn
from infini_train.distributed.algorithms.ddp_comm_hooks import default_hooks
from infini_train.nn.parallel import DistributedDataParallel as DDP
from tests.distributed.mpi_jobs import assert_every_rank_checked, mpirun, needs_mpiexec


@needs_mpiexec
def test_hooks_and_join_reduce_as_torch_on_two_ranks():
    proc = mpirun(2, "worker_ddp_hooks.py", timeout=120)
    assert_every_rank_checked(proc, "hooks ok", 2, at_least=29)


def model():
    it.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def test_a_custom_hook_sees_torchs_grad_bucket_and_its_future_value_is_the_gradient():
    ddp = DDP(model(), bucket_cap_mb=1e-4, first_bucket_mb=1e-4)
    seen = []

    def hook(state, bucket):
        grads = bucket.gradients()
        assert [g.shape for g in grads] == [p.shape for p in bucket.parameters()]
        assert sum(g.numel() for g in grads) == bucket.buffer().numel()
        seen.append((state, bucket.index(), bucket.is_last()))
        future = default_hooks.allreduce_hook(None, bucket)
        return future.then(lambda fut: [fut.value() * 2])  # torch's chaining, a list of one tensor as torch's

    ddp.register_comm_hook("state", hook)
    x = it.tensor(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))
    ddp(x).sum().backward()
    plain = model()
    plain(x).sum().backward()
    n = len(ddp.bucket_sizes)
    assert seen == [("state", b, b == n - 1) for b in range(n)] and n > 1
    for p, q in zip(ddp.module.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), 2 * q.grad.numpy(), rtol=1e-6)


def test_hook_errors_are_clear():
    ddp = DDP(model())
    with pytest.raises(TypeError, match="expected a callable"):
        ddp.register_comm_hook(None, 3)
    ddp.register_comm_hook(None, lambda state, bucket: None)
    with pytest.raises(RuntimeError, match="only be called once"):
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(TypeError, match=r"(?s)returned NoneType, expected a future.*HINT"):
        ddp(it.ones(2, 6)).sum().backward()
    with pytest.raises(TypeError, match="expected state to be a process group or None"):
        bad = DDP(model())
        bad.register_comm_hook(3, default_hooks.allreduce_hook)
        bad(it.ones(2, 6)).sum().backward()


def test_join_in_a_world_of_one_trains_as_without_it():
    ddp, plain = DDP(model()), model()
    x = it.ones(2, 6)
    with ddp.join():
        ddp(x).sum().backward()
    plain(x).sum().backward()
    for p, q in zip(ddp.module.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-6)
    with ddp.join(throw_on_early_termination=True):  # every rank (the one) runs out together: nothing to throw
        ddp(x).sum().backward()
