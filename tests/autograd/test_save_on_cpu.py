"""it.autograd.graph.save_on_cpu as torch's: a saved_tensors_hooks subclass whose hooks keep saved tensors on the
host (moved back for backward); on the CPU they pass the tensors through, and the gradients are bitwise those of
the graph without the hooks."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.graph import save_on_cpu, saved_tensors_hooks


def _model(x, w1, b1, w2):
    hidden = it.nn.functional.gelu(it.nn.functional.linear(x, w1, b1))
    return (it.nn.functional.linear(hidden, w2).tanh() * x.sum()).sum()


def _leaves(device="cpu"):
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5, 4), (5,), (2, 5)]
    return [it.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True, device=device) for s in shapes]


def _gradients(hooks=None, device="cpu"):
    leaves = _leaves(device)
    if hooks is None:
        loss = _model(*leaves)
    else:
        with hooks:
            loss = _model(*leaves)
    loss.backward()
    return [leaf.grad.numpy() for leaf in leaves]


def _counting(hooks):
    """``hooks`` with its pack and unpack counted (wrapped before the block is entered)."""
    counts = {"pack": 0, "unpack": 0}
    pack, unpack = hooks.pack_hook, hooks.unpack_hook

    def counted_pack(t):
        counts["pack"] += 1
        return pack(t)

    def counted_unpack(p):
        counts["unpack"] += 1
        return unpack(p)

    hooks.pack_hook, hooks.unpack_hook = counted_pack, counted_unpack
    return hooks, counts


def test_it_is_a_saved_tensors_hooks_as_torch():
    assert issubclass(save_on_cpu, saved_tensors_hooks)
    assert issubclass(torch.autograd.graph.save_on_cpu, torch.autograd.graph.saved_tensors_hooks)
    hooks = save_on_cpu()
    assert callable(hooks.pack_hook) and callable(hooks.unpack_hook)
    assert save_on_cpu(pin_memory=True).pin_memory


@pytest.mark.parametrize("pin_memory", [False, True])
def test_cpu_gradients_are_bitwise_unchanged_and_the_hooks_ran(pin_memory):
    plain = _gradients()
    hooks, counts = _counting(save_on_cpu(pin_memory=pin_memory))
    hooked = _gradients(hooks)
    assert counts["pack"] > 0 and counts["unpack"] >= counts["pack"] // 2, counts
    for a, b in zip(plain, hooked):
        assert a.tobytes() == b.tobytes()


def test_on_the_cpu_a_saved_tensor_passes_through_unchanged():
    x = it.tensor(np.arange(4, dtype=np.float32), requires_grad=True)
    packed = []
    hooks = save_on_cpu()
    pack = hooks.pack_hook
    hooks.pack_hook = lambda t: packed.append((t.array, pack(t))) or packed[-1][1]
    with hooks:
        (x * x).sum().backward()
    assert packed and all(stored is array for array, (_, stored) in packed)
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(4, dtype=np.float32))


def test_hooks_are_off_after_the_block_and_nest_with_others():
    seen = []
    with saved_tensors_hooks(lambda t: seen.append("outer") or t.array, lambda a: a):
        with save_on_cpu():
            it.tensor([1.0, 2.0], requires_grad=True).exp()
        it.tensor([1.0, 2.0], requires_grad=True).exp()
    assert seen == ["outer"]  # the inner save_on_cpu packed the first exp, the outer hooks the second
    hooks, counts = _counting(save_on_cpu())
    with hooks:
        pass
    it.tensor([1.0], requires_grad=True).exp()
    assert counts["pack"] == 0


def test_a_device_type_torch_does_not_move_is_refused():
    with pytest.raises(ValueError, match="(?s)device_type.*HINT"):
        save_on_cpu(device_type="xpu")


@pytest.mark.cuda
@pytest.mark.parametrize("pin_memory", [False, True])
def test_on_a_gpu_saved_tensors_wait_on_the_host_and_gradients_are_equal(pin_memory):
    if not it.backend.cuda_available():
        pytest.skip("no GPU")
    stored = []
    hooks = save_on_cpu(pin_memory=pin_memory)
    pack, unpack = hooks.pack_hook, hooks.unpack_hook
    hooks.pack_hook = lambda t: stored.append(pack(t)) or stored[-1]
    back = []
    hooks.unpack_hook = lambda p: back.append(unpack(p)) or back[-1]
    plain = _gradients(device="cuda")
    hooked = _gradients(hooks, device="cuda")
    assert stored and all(device.type == "cuda" and isinstance(array, np.ndarray) for device, array in stored)
    assert back and all(it.backend.is_cupy_array(a) for a in back)  # moved back to the GPU for backward
    for a, b in zip(plain, hooked):
        assert a.tobytes() == b.tobytes()
