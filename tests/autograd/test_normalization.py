import pytest
import torch

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("shape,ns", [((4, 8), (8,)), ((2, 3, 6), (6,)), ((2, 3, 4), (3, 4))], ids=str)
def test_layer_norm_with_affine(shape, ns):
    check_op([shape, ns, ns], lambda x, w, b: it.layer_norm(x, ns, w, b, eps=1e-5),
             lambda x, w, b: torch.nn.functional.layer_norm(x, ns, w, b, eps=1e-5), atol=1e-5)


def test_layer_norm_without_affine_and_weight_only():
    check_op([(3, 5)], lambda x: it.layer_norm(x, 5), lambda x: torch.nn.functional.layer_norm(x, (5,)), atol=1e-5)
    check_op([(3, 5), (5,)], lambda x, w: it.layer_norm(x, 5, w),
             lambda x, w: torch.nn.functional.layer_norm(x, (5,), w), atol=1e-5)


def test_layer_norm_shape_errors():
    with pytest.raises(ValueError, match=r"layer_norm: expected input whose trailing dims are \(4,\)"):
        it.layer_norm(it.ones(2, 3), 4)
    with pytest.raises(ValueError, match=r"layer_norm: expected weight of shape \(3,\)"):
        it.layer_norm(it.ones(2, 3), 3, it.ones(4))
