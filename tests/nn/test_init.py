"""nn.init: torch's fan and gain formulas, distribution statistics, seeding, in-place under grad mode."""
import math

import numpy as np
import pytest
import torch

import infini_train as it
from infini_train import nn
from infini_train.nn import init


@pytest.mark.parametrize("shape", [(3, 4), (7, 2), (5, 3, 2, 2), (4, 6, 3)])
def test_fans_equal_torch(shape):
    ours = init._calculate_fan_in_and_fan_out(it.empty(*shape))
    assert ours == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    with pytest.raises(ValueError, match="at least 2 dims"):
        init.xavier_uniform_(it.empty(5))


@pytest.mark.parametrize("name,param", [("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None),
                                        ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
                                        ("leaky_relu", math.sqrt(5)), ("selu", None)])
def test_calculate_gain_equals_torch(name, param):
    assert init.calculate_gain(name, param) == pytest.approx(torch.nn.init.calculate_gain(name, param), rel=1e-12)


def test_calculate_gain_rejects_unknown():
    with pytest.raises(ValueError, match="unsupported nonlinearity"):
        init.calculate_gain("swish")


def stats(fn, shape=(256, 512), **kw):
    t = it.empty(*shape)
    out = fn(t, **kw)
    assert out is t
    a = t.numpy()
    return a, float(a.mean()), float(a.std())


def torch_std(fn_name, shape, **kw):
    """The std that torch's formulas give (computed exactly; a sample's std would be noisy)."""
    fan_in, fan_out = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    if fn_name == "xavier_uniform_":
        return kw.get("gain", 1.0) * math.sqrt(6 / (fan_in + fan_out)) / math.sqrt(3)
    if fn_name == "xavier_normal_":
        return kw.get("gain", 1.0) * math.sqrt(2 / (fan_in + fan_out))
    fan = fan_in if kw.get("mode", "fan_in") == "fan_in" else fan_out
    gain = torch.nn.init.calculate_gain(kw.get("nonlinearity", "leaky_relu"), kw.get("a", 0))
    return gain / math.sqrt(fan)  # kaiming uniform and normal share the std


@pytest.mark.parametrize("fn_name,kw", [("xavier_uniform_", {}), ("xavier_uniform_", {"gain": 2.0}),
                                        ("xavier_normal_", {}), ("kaiming_uniform_", {}),
                                        ("kaiming_uniform_", {"a": math.sqrt(5)}),
                                        ("kaiming_uniform_", {"mode": "fan_out", "nonlinearity": "relu"}),
                                        ("kaiming_normal_", {"nonlinearity": "relu"}),
                                        ("kaiming_normal_", {"mode": "fan_out", "nonlinearity": "tanh"})])
def test_fan_based_inits_have_torchs_std(fn_name, kw):
    shape = (256, 512)
    it.manual_seed(0)
    a, mean, std = stats(getattr(init, fn_name), shape, **kw)
    want = torch_std(fn_name, shape, **kw)
    assert abs(std - want) < 0.01 * want and abs(mean) < 0.01 * want
    if "uniform" in fn_name:  # bounded by sqrt(3) std, and reaching it
        assert np.abs(a).max() <= want * math.sqrt(3) * (1 + 1e-6)
        assert np.abs(a).max() > 0.99 * want * math.sqrt(3)
    # the same draw through torch with our std agrees in distribution with torch's own function
    tt = torch.empty(shape)
    getattr(torch.nn.init, fn_name)(tt, **kw)
    assert abs(float(tt.std()) - std) < 0.02 * want


def test_simple_fills_and_distributions():
    it.manual_seed(1)
    _, mean, std = stats(init.normal_, mean=2.0, std=0.5)
    assert abs(mean - 2.0) < 0.005 and abs(std - 0.5) < 0.005
    a, mean, _ = stats(init.uniform_, a=-1.0, b=3.0)
    assert a.min() >= -1 and a.max() <= 3 and abs(mean - 1.0) < 0.01
    a, _, _ = stats(init.trunc_normal_, std=1.0, a=-0.5, b=0.5)
    assert a.min() >= -0.5 and a.max() <= 0.5 and a.std() > 0.25
    assert np.all(init.constant_(it.empty(3), 0.25).numpy() == 0.25)
    assert np.all(init.zeros_(it.ones(3)).numpy() == 0) and np.all(init.ones_(it.zeros(3)).numpy() == 1)


def test_seeded_reproducibility_and_dtype():
    def draw(seed):
        it.manual_seed(seed)
        return [f(it.empty(20, 30)).numpy().copy() for f in (init.normal_, init.xavier_uniform_, init.kaiming_normal_)]

    for a, b in zip(draw(5), draw(5)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(draw(5)[0], draw(6)[0])
    t = init.normal_(it.empty(4, dtype=it.float64))
    assert t.dtype == it.float64


def test_init_on_parameters_in_place_with_grad_mode_on():
    lin = nn.Linear(3, 3)
    w = lin.weight
    version = w.version
    assert it.is_grad_enabled()
    init.kaiming_normal_(lin.weight)
    init.zeros_(lin.bias)
    assert lin.weight is w and w.version > version and not lin.bias.numpy().any()
    assert w.requires_grad and w.grad_fn is None
    empty = it.empty(0, 3)
    assert init.kaiming_uniform_(empty) is empty  # torch skips empty tensors
