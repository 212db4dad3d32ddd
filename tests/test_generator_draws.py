"""``generator=`` on the random factories, the in-place fills and nn.init, as torch's: a generator's draws leave
the global stream exactly where it was, the same seed gives the same draws, and shapes, dtypes and ranges match
torch's on the same call (the values come from other streams, so they are not compared)."""
import math

import numpy as np
import pytest
import torch

import infini_train as it

# name -> the same call in both frameworks: fn(framework, generator) -> tensor
CALLS = {
    "randn": lambda f, g: f.randn(3, 4, generator=g),
    "randn_float64": lambda f, g: f.randn((2, 5), generator=g, dtype=f.float64),
    "rand": lambda f, g: f.rand(7, generator=g),
    "randint": lambda f, g: f.randint(3, 9, (4, 2), generator=g),
    "randint_high_only": lambda f, g: f.randint(5, size=(6,), generator=g),
    "randn_like": lambda f, g: f.randn_like(f.zeros(2, 3), generator=g),
    "randperm": lambda f, g: f.randperm(12, generator=g),
    "Tensor.uniform_": lambda f, g: f.zeros(5, 2).uniform_(-2.0, 3.0, generator=g),
    "Tensor.normal_": lambda f, g: f.zeros(8).normal_(1.0, 0.5, generator=g),
    "init.uniform_": lambda f, g: f.nn.init.uniform_(f.zeros(4, 3), -1.0, 1.0, generator=g),
    "init.normal_": lambda f, g: f.nn.init.normal_(f.zeros(4, 3), 0.0, 2.0, generator=g),
    "init.trunc_normal_": lambda f, g: f.nn.init.trunc_normal_(f.zeros(50), 0.0, 1.0, -0.5, 0.5, generator=g),
    "init.xavier_uniform_": lambda f, g: f.nn.init.xavier_uniform_(f.zeros(6, 4), generator=g),
    "init.xavier_normal_": lambda f, g: f.nn.init.xavier_normal_(f.zeros(6, 4), generator=g),
    "init.kaiming_uniform_": lambda f, g: f.nn.init.kaiming_uniform_(f.zeros(6, 4), generator=g),
    "init.kaiming_normal_": lambda f, g: f.nn.init.kaiming_normal_(f.zeros(6, 4), mode="fan_out", generator=g),
}
# the range each call's values must lie in (both frameworks): (low, high), inclusive
RANGES = {"randperm": (0, 11),
          "rand": (0.0, 1.0), "randint": (3, 8), "randint_high_only": (0, 4), "Tensor.uniform_": (-2.0, 3.0),
          "init.uniform_": (-1.0, 1.0), "init.trunc_normal_": (-0.5, 0.5),
          "init.xavier_uniform_": (-math.sqrt(6 / 10), math.sqrt(6 / 10)),  # fan_in 4 + fan_out 6
          "init.kaiming_uniform_": (-math.sqrt(6 / 4), math.sqrt(6 / 4))}  # gain sqrt(2), fan_in 4


def _numpy(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t.numpy()


@pytest.mark.parametrize("name", CALLS)
def test_the_global_stream_continues_as_if_the_generator_had_not_drawn(name):
    it.manual_seed(0)
    untouched = it.randn(16).numpy().copy()
    it.manual_seed(0)
    CALLS[name](it, it.Generator().manual_seed(1))
    np.testing.assert_array_equal(it.randn(16).numpy(), untouched)
    torch.manual_seed(0)  # the same holds in torch
    t_untouched = torch.randn(16)
    torch.manual_seed(0)
    CALLS[name](torch, torch.Generator().manual_seed(1))
    assert torch.equal(torch.randn(16), t_untouched)


@pytest.mark.parametrize("name", CALLS)
def test_the_same_seed_draws_the_same_and_the_generator_advances(name):
    g = it.Generator().manual_seed(5)
    first, second = _numpy(CALLS[name](it, g)).copy(), _numpy(CALLS[name](it, g)).copy()
    np.testing.assert_array_equal(_numpy(CALLS[name](it, it.Generator().manual_seed(5))), first)
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("name", CALLS)
def test_a_generator_draw_is_not_the_global_draw_of_the_same_seed_call(name):
    """Guards against an ignored generator= (then the call would draw from the global stream)."""
    it.manual_seed(5)
    global_draw = _numpy(CALLS[name](it, None)).copy()
    it.manual_seed(5)
    np.testing.assert_array_equal(_numpy(CALLS[name](it, None)), global_draw)
    it.manual_seed(5)
    assert not np.array_equal(_numpy(CALLS[name](it, it.Generator().manual_seed(6))), global_draw)


@pytest.mark.parametrize("name", CALLS)
def test_shape_dtype_and_range_as_torch(name):
    mine = CALLS[name](it, it.Generator().manual_seed(2))
    theirs = CALLS[name](torch, torch.Generator().manual_seed(2))
    assert tuple(mine.shape) == tuple(theirs.shape)
    assert str(mine.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    if name in RANGES:
        low, high = RANGES[name]
        for values in (_numpy(mine), _numpy(theirs)):
            assert values.min() >= low and values.max() <= high, (name, values)


def test_a_generator_that_is_not_one_is_refused_as_torch():
    with pytest.raises(TypeError):
        torch.randn(2, generator=5)
    with pytest.raises(TypeError, match="(?s)randn: generator must be an it.Generator or None, but got int.*HINT"):
        it.randn(2, generator=5)
    with pytest.raises(TypeError, match="normal_: generator must be"):
        it.zeros(2).normal_(generator=np.random.default_rng(0))


def test_a_generator_passed_positionally_to_randint_is_refused():
    """generator= is keyword-only in torch's signatures; randint keeps dtype as its fourth argument."""
    with pytest.raises(TypeError):
        it.randint(0, 5, (2,), it.int64, "cpu", it.Generator())


@pytest.mark.cuda
def test_a_cpu_generator_on_a_gpu_tensor_is_refused_as_torch():
    if not it.backend.cuda_available():
        pytest.skip("no GPU")
    with pytest.raises(RuntimeError, match="expected a 'cuda' device type for generator but found 'cpu'"):
        it.randn(2, device="cuda", generator=it.Generator())
    g = it.Generator(device="cuda").manual_seed(3)
    it.manual_seed(0)
    untouched = it.randn(16, device="cuda").numpy()
    it.manual_seed(0)
    first = it.zeros(5, device="cuda").uniform_(generator=g).numpy()
    np.testing.assert_array_equal(it.randn(16, device="cuda").numpy(), untouched)
    np.testing.assert_array_equal(it.zeros(5, device="cuda").uniform_(generator=g.manual_seed(3)).numpy(), first)


def test_randperm_is_a_permutation_of_torchs_dtype_and_refuses_a_bad_n():
    got, want = it.randperm(50, generator=it.Generator().manual_seed(3)), torch.randperm(50)
    assert sorted(got.numpy().tolist()) == list(range(50)) and str(got.dtype) == "int64" == str(want.dtype)[6:]
    assert it.randperm(6, dtype=it.float32).dtype == it.float32 and it.randperm(0).shape == (0,)
    with pytest.raises(ValueError, match=r"randperm: expected n, a non-negative int, got -1"):
        it.randperm(-1)
