"""In-process tests of the pieces that need no second rank: ReduceOp, Work (completion, failure, timeout),
the timeout setting, a world of one (SingleProcessGroup) and the argument checks every backend shares."""
import datetime

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import AllReducePostAccumulateHook
from infini_train.distributed import ReduceOp, Work
from infini_train.distributed.process_group import SingleProcessGroup
from infini_train.distributed.work import resolve_timeout


@pytest.mark.parametrize("name, op", [("sum", ReduceOp.SUM), ("SUM", ReduceOp.SUM), ("avg", ReduceOp.AVG),
                                      ("mean", ReduceOp.AVG), ("Max", ReduceOp.MAX), ("min", ReduceOp.MIN),
                                      ("product", ReduceOp.PRODUCT), ("prod", ReduceOp.PRODUCT)])
def test_reduce_op_parses_names(name, op):
    assert ReduceOp.parse(name) is op
    assert ReduceOp.parse(op) is op


def test_reduce_op_rejects_unknown_names():
    with pytest.raises(ValueError, match=r"all_reduce: expected a ReduceOp .* got 'median'\nHINT"):
        ReduceOp.parse("median", "all_reduce")
    with pytest.raises(ValueError):
        ReduceOp.parse(3)


class _Fake:
    """A group stand-in for Work's messages."""
    ranks, rank, world_rank, backend, timeout = [0, 3], 1, 3, "fake", 5.0

    def describe(self, name):
        return f"{name} on group ranks {self.ranks} (this is world rank {self.world_rank})"


def test_work_completes_once_and_runs_its_finish_once():
    polls, finished = [], []
    work = Work(_Fake(), "all_reduce", lambda: polls.append(1) or len(polls) >= 3, lambda: finished.append(1))
    assert not work.is_completed() and not work.is_completed()
    assert work.wait() is True and work.is_completed() and work.is_success()
    assert work.wait() is True and len(polls) == 3 and finished == [1]
    assert work.timeout == 5.0 and "completed" in repr(work)


def test_work_timeout_names_the_collective_ranks_and_this_rank():
    aborted = []
    work = Work(_Fake(), "all_gather", lambda: False, on_timeout=lambda: aborted.append(1))
    t0 = datetime.datetime.now()
    with pytest.raises(RuntimeError) as info:
        work.wait(timeout=0.05)
    assert (datetime.datetime.now() - t0).total_seconds() < 2
    msg = str(info.value)
    assert msg.startswith("all_gather on group ranks [0, 3] (this is world rank 3) did not complete within 0.05 s")
    assert "\nHINT:" in msg and "INFINI_TRAIN_COLLECTIVE_TIMEOUT" in msg
    assert aborted == [1] and not work.is_completed()


def test_work_failure_is_raised_by_wait():
    def broken():
        raise OSError("message truncated")

    work = Work(_Fake(), "broadcast", broken)
    assert work.is_completed() and not work.is_success()
    with pytest.raises(RuntimeError, match=r"broadcast on group ranks \[0, 3\] .* failed: message truncated"):
        work.wait()
    assert isinstance(work.exception(), OSError)


def test_resolve_timeout(monkeypatch):
    monkeypatch.delenv("INFINI_TRAIN_COLLECTIVE_TIMEOUT", raising=False)
    assert resolve_timeout() == 300.0
    assert resolve_timeout(2) == 2.0 and resolve_timeout(datetime.timedelta(minutes=1)) == 60.0
    monkeypatch.setenv("INFINI_TRAIN_COLLECTIVE_TIMEOUT", "42.5")
    assert resolve_timeout() == 42.5
    monkeypatch.setenv("INFINI_TRAIN_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="INFINI_TRAIN_COLLECTIVE_TIMEOUT='soon'\nHINT"):
        resolve_timeout()
    with pytest.raises(ValueError, match="positive"):
        resolve_timeout(0)


def test_world_of_one_collectives_are_identities_and_bump_versions():
    g = SingleProcessGroup(timeout=3)
    t = it.tensor([1.0, 2.0])
    for op in ("sum", ReduceOp.AVG, "max", "min", "product"):
        v = t._version[0]
        assert g.all_reduce(t, op) is None and t.tolist() == [1.0, 2.0] and t._version[0] == v + 1
    work = g.all_reduce(t, async_op=True)
    assert isinstance(work, Work) and work.is_completed() and work.wait()
    outs = [it.zeros(2)]
    g.all_gather(outs, t)
    assert outs[0].tolist() == [1.0, 2.0] and outs[0]._version[0] == 1
    out = it.zeros(2)
    g.reduce_scatter(out, [it.tensor([5.0, 6.0])], "avg")
    assert out.tolist() == [5.0, 6.0]
    g.broadcast(t, 0)
    g.reduce(t, 0)
    assert g.barrier(async_op=True).wait()
    assert (g.size, g.rank, g.ranks, g.world_rank, g.backend) == (1, 0, [0], 0, "single")


def test_a_collective_overwriting_a_tensor_saved_for_backward_is_caught():
    g = SingleProcessGroup()
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()  # saves x
    g.all_reduce(x.detach())  # writes x's memory in place: not an autograd op, but versioned
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("call, error, needle", [
    (lambda g: g.all_reduce(it.tensor([1, 2]), "avg"), ValueError, "floating tensor for ReduceOp.AVG"),
    (lambda g: g.all_reduce([1.0, 2.0]), TypeError, "expected an infini_train Tensor"),
    (lambda g: g.all_reduce(np.broadcast_to(np.ones(1), (3,))), ValueError, "writable"),
    (lambda g: g.all_gather([it.zeros(2), it.zeros(2)], it.zeros(2)), ValueError, "one tensor per rank (1)"),
    (lambda g: g.all_gather([it.zeros(3)], it.zeros(2)), ValueError, "tensor_list[0] of shape (2,)"),
    (lambda g: g.reduce_scatter(it.zeros(2), [it.zeros(2, dtype=it.float64)]), ValueError, "dtype float32"),
    (lambda g: g.broadcast(it.zeros(2), src=1), ValueError, "src to be a group rank in [0, 1)"),
    (lambda g: g.reduce(it.zeros(2), dst=-1), ValueError, "dst to be a group rank"),
    (lambda g: g.send(it.zeros(2), dst=0), ValueError, "another rank than this one"),
    (lambda g: g.all_reduce(it.zeros(2), "median"), ValueError, "all_reduce: expected a ReduceOp"),
])
def test_argument_errors_name_the_collective(call, error, needle):
    with pytest.raises(error) as info:
        call(SingleProcessGroup())
    assert needle in str(info.value)


def test_all_reduce_hook_accepts_a_string_op_on_a_world_of_one():
    w = it.tensor([1.0, 2.0], requires_grad=True)
    w.register_post_accumulate_grad_hook(AllReducePostAccumulateHook("avg", SingleProcessGroup()))
    (w * 4).sum().backward()
    assert w.grad.tolist() == [4.0, 4.0]
