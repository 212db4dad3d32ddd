import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

AWAY_FROM_ZERO = np.array([[-2.0, -0.7, -0.1, 0.2], [0.5, 1.3, -1.1, 3.0]], np.float32)


@pytest.mark.parametrize("shape", [(3, 4), (), (0, 2)], ids=str)
def test_sigmoid_silu_softplus(shape):
    check_op([shape], it.sigmoid, torch.sigmoid)
    check_op([shape], it.silu, torch.nn.functional.silu)
    check_op([shape], it.softplus, torch.nn.functional.softplus)


def test_softplus_beta_threshold():
    check_op([(4, 5)], lambda x: it.softplus(x * 10, beta=2.0, threshold=5.0),
             lambda x: torch.nn.functional.softplus(x * 10, beta=2.0, threshold=5.0), fd=False)


def test_relu():
    check_op([AWAY_FROM_ZERO], it.relu, torch.relu)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 7), (2, 3, 4), ()], ids=str)
def test_gelu(approximate, shape):
    check_op([shape], lambda x: it.gelu(x, approximate=approximate),
             lambda x: torch.nn.functional.gelu(x, approximate=approximate), low=-4, high=4)


def test_sigmoid_is_finite_at_extremes():
    x = it.tensor([-1e4, 0.0, 1e4])
    np.testing.assert_allclose(it.sigmoid(x).numpy(), [0.0, 0.5, 1.0])


def test_gelu_bad_approximate():
    with pytest.raises(ValueError, match="gelu: expected approximate='none' or 'tanh'"):
        it.gelu(it.ones(2), approximate="fast")
