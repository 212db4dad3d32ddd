import sys
import threading

import numpy as np
import pytest

import infini_train as it
from infini_train.autograd import Function


class Counted(Function):
    """Identity-times-k node that counts its backward calls."""

    calls = []

    def __init__(self, k, tag):
        self.k, self.tag = k, tag

    def forward(self, x):
        return x * self.k

    def backward(self, g):
        Counted.calls.append(self.tag)
        return g * self.k


def setup_function():
    Counted.calls = []


def test_diamond_runs_each_node_once_after_all_consumers():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    root = Counted(1.0, "root").apply(x)
    a = Counted(2.0, "a").apply(root)
    b = Counted(3.0, "b").apply(root)
    (a * b).sum().backward()
    assert sorted(Counted.calls) == ["a", "b", "root"]
    assert Counted.calls[-1] == "root"  # root waited for both consumers
    # d/dx (2x * 3x) = 12x
    np.testing.assert_allclose(x.grad.numpy(), [12.0, 24.0])
    assert root.grad_fn.dependencies_number == 2
    assert root.grad_fn.dependencies_reached == 2


def test_dependencies_count_only_edges_reachable_from_the_root():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    unused = y * 5  # a consumer outside the backward graph must not block y's node
    (y * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])
    assert unused.grad_fn is not None


class SplitTwo(Function):
    def forward(self, x):
        return it.tensor(x.numpy()[:1]), it.tensor(x.numpy()[1:])

    def backward(self, g0, g1):
        return it.tensor(np.concatenate([g0.numpy(), g1.numpy()]))


def test_multi_output_missing_gradient_is_zeros():
    x = it.tensor([1.0, 2.0, 3.0], requires_grad=True)
    first, rest = SplitTwo().apply(x)
    assert first.grad_fn is rest.grad_fn
    assert (first._output_idx, rest._output_idx) == (0, 1)
    (rest * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 2.0, 2.0])


def test_multi_output_gradients_accumulate_per_output():
    x = it.tensor([1.0, 2.0, 3.0], requires_grad=True)
    first, rest = SplitTwo().apply(x)
    fn = first.grad_fn
    (first.sum() * 3 + (rest * 2).sum() + rest.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0, 3.0])
    assert fn.grad_outputs_reached == 2


def test_chain_of_100k_ops_has_no_recursion_error():
    x = it.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.0
    assert sys.getrecursionlimit() < 100_000
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


def test_grads_accumulate_across_two_backward_calls():
    x = it.tensor([1.0, -2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0 + 3.0, -4.0 + 3.0])


def test_retain_graph_allows_a_second_backward_and_freed_graph_raises():
    x = it.tensor([2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [8.0])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_non_leaf_grads_are_not_kept_unless_retained():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    mid = x * 2
    kept = x * 3
    kept.retain_grad()
    (mid + kept).sum().backward()
    assert mid.grad is None
    np.testing.assert_allclose(kept.grad.numpy(), [1.0, 1.0])


def test_backward_on_non_scalar_without_gradient_raises():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(it.tensor([1.0, 10.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 20.0])


def test_backward_on_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        it.tensor([1.0]).sum().backward()


def test_two_leaves_never_share_a_gradient_array():
    a = it.tensor([1.0, 2.0], requires_grad=True)
    b = it.tensor([3.0, 4.0], requires_grad=True)
    (a + b).backward(it.tensor([1.0, 1.0]))
    assert a.grad.array is not b.grad.array
    a.grad.mul_(10)
    np.testing.assert_allclose(b.grad.numpy(), [1.0, 1.0])


def test_user_gradient_is_not_aliased_into_leaf_grad():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    seed = it.tensor([5.0, 6.0])
    x.backward(seed)
    x.grad.zero_()
    np.testing.assert_allclose(seed.numpy(), [5.0, 6.0])


def test_inplace_modification_of_saved_tensor_is_detected():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    w = it.tensor([3.0, 4.0])
    y = x * w
    w.add_(1.0)
    with pytest.raises(RuntimeError, match="Mul: one of the variables needed for gradient computation has been "
                                           "modified by an inplace operation"):
        y.sum().backward()


def test_inplace_on_saved_output_is_detected():
    x = it.tensor([0.5], requires_grad=True)
    y = x.exp()
    with it.no_grad():
        y.mul_(2.0)
    with pytest.raises(RuntimeError, match="Exp: .*modified by an inplace operation"):
        y.sum().backward()


def test_inplace_on_leaf_requiring_grad_under_grad_mode_raises():
    x = it.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="add_: a leaf tensor that requires grad"):
        x.add_(1.0)
    with it.no_grad():
        x.add_(1.0)
    np.testing.assert_allclose(x.numpy(), [2.0])


def test_views_share_the_version_counter():
    x = it.tensor([[1.0, 2.0], [3.0, 4.0]])
    v = x.reshape(4)
    x.mul_(2)
    assert v.version == x.version == 1
    d = x.detach()
    d.zero_()
    assert x.version == 2


def test_tensor_hooks_run_in_order_and_may_replace_the_gradient():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda g: seen.append(("first", g.numpy().tolist())))
    y.register_hook(lambda g: g * 10)
    y.register_hook(lambda g: seen.append(("third", g.numpy().tolist())))
    y.sum().backward()
    assert seen == [("first", [1.0, 1.0]), ("third", [10.0, 10.0])]
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 20.0])


def test_leaf_hook_and_post_accumulate_hooks_run_once_each_in_order():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    order = []
    x.register_hook(lambda g: order.append("pre") or g * 2)
    h1 = x.register_post_accumulate_grad_hook(lambda t: order.append(("post1", t.grad.numpy().tolist())))
    x.register_post_accumulate_grad_hook(lambda t: order.append("post2"))
    (x * 3).sum().backward()
    assert order == ["pre", ("post1", [6.0, 6.0]), "post2"]
    h1.remove()
    order.clear()
    (x * 1).sum().backward()
    assert order == ["pre", "post2"]


def test_accumulate_grad_learning_rate_scales():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    node = it.autograd.AccumulateGrad(x, learning_rate=0.5)
    x._accumulate = node
    (x * 4).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_next_functions_and_needs_input_grad():
    a = it.tensor([1.0], requires_grad=True)
    b = it.tensor([2.0])
    c = a * b
    fn = c.grad_fn
    assert fn.needs_input_grad == (True, False)
    assert isinstance(fn.next_functions[0][0], it.autograd.AccumulateGrad)
    assert fn.next_functions[1] == (None, 0)
    d = c + a
    assert d.grad_fn.next_functions[0] == (fn, 0)


class Cube(Function):
    def forward(self, x, scale):
        return x * x * x * scale

    def setup_context(self, inputs, output):
        x, scale = inputs
        self.save_for_backward(x)
        self.scale = scale

    def backward(self, g):
        (x,) = self.saved_tensors
        return g * 3 * x * x * self.scale, None


def test_custom_function_subclass():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = Cube().apply(x, 2.0)
    np.testing.assert_allclose(y.numpy(), [2.0, 16.0])
    assert y.grad_fn.needs_input_grad == (True, False)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 24.0])


class WrongCount(Function):
    def forward(self, x):
        return x * 1

    def backward(self, g):
        return g, g


def test_custom_function_returning_wrong_number_of_grads_raises():
    x = it.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="returned 2 gradients, expected 1"):
        WrongCount().apply(x).sum().backward()


def test_backward_runs_in_a_worker_thread():
    x = it.tensor([3.0], requires_grad=True)
    errors = []

    def work():
        try:
            (x * x).sum().backward()
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


class PassThrough(Function):
    def forward(self, x):
        return x

    def backward(self, g):
        return g * 2


def test_custom_function_returning_its_input_does_not_rewire_the_input():
    x = it.tensor([1.0, 2.0], requires_grad=True)
    y = PassThrough().apply(x)
    assert y is not x and x.is_leaf and x.grad_fn is None
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_zero_dim_leaf_accumulates_over_two_backward_calls():
    x = it.tensor(2.0, requires_grad=True)
    (x * x).backward()
    (x * x).backward()  # numpy returns scalars for 0-d products; accumulation must still work in place
    assert x.grad.item() == 8.0
    x.grad.zero_()
    assert x.grad.item() == 0.0
