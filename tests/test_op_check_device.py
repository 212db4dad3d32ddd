"""The op-check suite's device (``pytest --op-device``): check_op builds the inputs, the cotangents and any tensor
the op function makes on that device, and compares through host copies. Exercised here with a logical CPU device."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests import op_check


@pytest.fixture
def on_cpu1(monkeypatch):
    monkeypatch.setattr(op_check, "DEVICE", "cpu:1")


def test_check_op_runs_infini_train_on_the_chosen_device(on_cpu1):
    seen = []

    def scaled_exp(x):
        seen.append(x.device)
        return x.exp() * it.tensor(2.0)  # a tensor the op makes: on the same device, else a device mismatch

    op_check.check_op([(3, 4)], scaled_exp, lambda x: x.exp() * 2.0, fd=False)
    assert seen and all(d == it.device("cpu:1") for d in seen)


def test_a_wrong_result_on_the_chosen_device_still_fails(on_cpu1):
    with pytest.raises(AssertionError, match="forward differs from torch"):
        op_check.check_op([(5,)], lambda x: x.exp(), lambda x: torch.exp(x) + 1e-3, fd=False)


def test_host_copies_of_both_frameworks_tensors():
    assert op_check.host(torch.ones(2)).tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(op_check.host(it.tensor([1.0, 2.0], device="cpu:1")), [1.0, 2.0])


def test_tensor_takes_the_default_device_as_torch_tensor_does():
    on_host = it.ones(2)
    with it.device("cpu:1"):
        assert it.tensor([1.0, 2.0]).device == it.device("cpu:1")
        assert it.tensor(np.ones(2)).device == it.device("cpu:1")
        assert it.tensor(on_host).device == it.device("cpu")  # a Tensor keeps its own device
        assert it.tensor(1.0, device="cpu").device == it.device("cpu")
    with torch.device("meta"):
        assert torch.tensor([1.0]).device.type == "meta"  # the behaviour followed
    assert it.tensor([1.0]).device == it.device("cpu")
