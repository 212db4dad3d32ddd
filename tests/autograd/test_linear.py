import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("xshape", [(5,), (4, 5), (2, 3, 5)], ids=str)
def test_linear_with_and_without_bias(xshape):
    check_op([xshape, (3, 5), (3,)], it.linear, torch.nn.functional.linear, atol=1e-5)
    check_op([xshape, (3, 5)], it.linear, torch.nn.functional.linear, atol=1e-5)


def test_linear_errors():
    with pytest.raises(ValueError, match=r"linear: expected x \(\.\.\., 5\) and weight \(out, in\)"):
        it.linear(it.ones(2, 4), it.ones(3, 5))
    with pytest.raises(ValueError, match=r"linear: expected bias of shape \(3,\)"):
        it.linear(it.ones(2, 5), it.ones(3, 5), it.ones(4))
