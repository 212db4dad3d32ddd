"""it.Generator as torch.Generator: the object's API (seeding, initial_seed, seed, get_state / set_state, device)
and its errors, run side by side with torch 2.13's on the same program. Draws are compared with themselves (the
streams differ from torch's): same seed, same draws; a state moved to another generator replays."""
import numpy as np
import pytest
import torch

import infini_train as it


def _draws(g, n=6):
    return it.randn(n, generator=g).numpy().copy()


def test_the_api_as_torch():
    mine, theirs = it.Generator(), torch.Generator()
    assert str(mine.device) == str(theirs.device) == "cpu"
    assert it.Generator(device="cpu").device.type == torch.Generator(device="cpu").device.type
    assert mine.initial_seed() == theirs.initial_seed()  # the same default seed
    assert mine.manual_seed(7) is mine and theirs.manual_seed(7) is theirs
    assert mine.initial_seed() == theirs.initial_seed() == 7
    m_state, t_state = mine.get_state(), theirs.get_state()
    assert m_state.dtype == it.uint8 and t_state.dtype == torch.uint8
    assert m_state.ndim == t_state.ndim == 1 and str(m_state.device) == str(t_state.device) == "cpu"
    assert mine.set_state(m_state) is mine and theirs.set_state(t_state) is theirs


@pytest.mark.parametrize("seed", [-1, -(2 ** 63), 2 ** 64 - 1, 0, 12345])
def test_seeds_wrap_as_torch(seed):
    assert it.Generator().manual_seed(seed).initial_seed() == torch.Generator().manual_seed(seed).initial_seed()


def test_same_seed_same_draws_other_seed_other_draws():
    a, b = it.Generator().manual_seed(3), it.Generator().manual_seed(3)
    np.testing.assert_array_equal(_draws(a), _draws(b))
    assert not np.array_equal(_draws(it.Generator().manual_seed(3)), _draws(it.Generator().manual_seed(4)))
    np.testing.assert_array_equal(_draws(it.Generator()), _draws(it.Generator()))  # unseeded: the default seed


def test_seed_is_nondeterministic_and_becomes_the_initial_seed():
    g = it.Generator()
    first, second = g.seed(), g.seed()
    assert first != second and g.initial_seed() == second and 0 <= first < 2 ** 64
    replay = _draws(it.Generator().manual_seed(second), 4)
    np.testing.assert_array_equal(_draws(g, 4), replay)


def test_a_state_set_on_another_generator_replays_from_there():
    g = it.Generator().manual_seed(11)
    _draws(g, 5)
    it.rand(1, generator=g)  # an odd number of 32-bit halves drawn: the buffered half is in the state too
    state = g.get_state()
    other = it.Generator().manual_seed(99).set_state(state)
    assert other.initial_seed() == 11
    for _ in range(3):
        np.testing.assert_array_equal(_draws(g), _draws(other))
        np.testing.assert_array_equal(it.randint(0, 1000, (5,), generator=g).numpy(),
                                      it.randint(0, 1000, (5,), generator=other).numpy())


def test_get_state_is_a_copy():
    g = it.Generator().manual_seed(0)
    state = g.get_state()
    first = _draws(g)
    np.testing.assert_array_equal(_draws(g.set_state(state)), first)
    np.testing.assert_array_equal(_draws(g.set_state(state)), first)


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info


@pytest.mark.parametrize("seed", [1.5, True, "3"])
def test_a_seed_that_is_not_an_int_is_refused_as_torch(seed):
    mine = _error(lambda: it.Generator().manual_seed(seed))
    theirs = _error(lambda: torch.Generator().manual_seed(seed))
    assert "expected a long" in str(mine.value) and "HINT" in str(mine.value)
    assert type(theirs.value) in (RuntimeError, TypeError)


@pytest.mark.parametrize("seed", [2 ** 64, -(2 ** 63) - 1])
def test_a_seed_out_of_range_is_refused(seed):
    _error(lambda: torch.Generator().manual_seed(seed))
    with pytest.raises(ValueError, match="out of range"):
        it.Generator().manual_seed(seed)


def test_set_state_refuses_what_is_not_a_uint8_tensor_as_torch():
    with pytest.raises(TypeError):
        torch.Generator().set_state(torch.zeros(3))
    with pytest.raises(TypeError, match="(?s)uint8 tensor.*float32.*HINT"):
        it.Generator().set_state(it.zeros(3))
    with pytest.raises(TypeError):
        torch.Generator().set_state([1, 2])
    with pytest.raises(TypeError, match="uint8 tensor.*list"):
        it.Generator().set_state([1, 2])


def test_set_state_refuses_a_state_of_the_wrong_size_as_torch():
    with pytest.raises(RuntimeError):
        torch.Generator().set_state(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="56 bytes, but got 3"):
        it.Generator().set_state(it.zeros(3, dtype=it.uint8))


def test_a_generator_on_an_unknown_device_is_refused():
    with pytest.raises(RuntimeError, match="'cpu' or 'cuda'"):
        it.Generator(device="meta")


@pytest.mark.cuda
def test_a_cuda_generator_replays_its_state():
    if not it.backend.cuda_available():
        pytest.skip("no GPU")
    g = it.Generator(device="cuda").manual_seed(5)
    assert g.device.type == "cuda" and g.device.index == 0
    state = g.get_state()
    first = it.randn(64, device="cuda", generator=g).numpy()
    other = it.Generator(device="cuda").set_state(state)
    np.testing.assert_array_equal(it.randn(64, device="cuda", generator=other).numpy(), first)
    with pytest.raises(RuntimeError, match="expected a 'cpu' device type for generator but found 'cuda'"):
        it.randn(2, generator=g)
