import numpy as np

import infini_train as it
from infini_train.autograd import AllReducePostAccumulateHook, PostAccumulateGradHook


class FakeGroup:
    """Stands in for a process group of 3 ranks whose peers hold the same gradient."""

    def __init__(self, world=3):
        self.world = world
        self.calls = []

    def all_reduce(self, tensor, op):
        self.calls.append((op, tensor.numpy().copy()))
        with it.no_grad():
            if op == "sum":
                tensor.mul_(self.world)


def test_allreduce_hook_reduces_the_accumulated_grad_once_per_backward():
    group = FakeGroup()
    w = it.tensor([1.0, 2.0], requires_grad=True)
    w._accumulate_node().register_post_accumulate_hook(AllReducePostAccumulateHook("sum", group))
    x = it.tensor([3.0, 4.0])
    ((w * x).sum() + (w * 2).sum()).backward()
    assert len(group.calls) == 1
    op, seen = group.calls[0]
    assert op == "sum"
    np.testing.assert_allclose(seen, [5.0, 6.0])  # the fully accumulated local grad
    np.testing.assert_allclose(w.grad.numpy(), [15.0, 18.0])


def test_post_accumulate_hook_base_class_subclassing():
    class Record(PostAccumulateGradHook):
        def __init__(self):
            self.grads = []

        def __call__(self, tensor):
            self.grads.append(tensor.grad.numpy().copy())

    hook = Record()
    w = it.tensor([1.0], requires_grad=True)
    w._accumulate_node().register_post_accumulate_hook(hook)
    (w * 5).sum().backward()
    (w * 7).sum().backward()
    np.testing.assert_allclose(np.array(hook.grads).ravel(), [5.0, 12.0])
