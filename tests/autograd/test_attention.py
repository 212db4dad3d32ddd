import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op

F = torch.nn.functional


@pytest.mark.parametrize("shapes", [[(2, 5, 4), (2, 5, 4), (2, 5, 3)], [(1, 2, 3, 4), (1, 2, 6, 4), (1, 2, 6, 4)]],
                         ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa(shapes, causal):
    # atol 1e-5: two chained float32 matmuls around a softmax
    check_op(shapes, lambda q, k, v: it.scaled_dot_product_attention(q, k, v, is_causal=causal),
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=1e-5)


def test_sdpa_with_bool_and_float_masks_and_scale():
    bool_mask = np.array([[True, False, True, True], [True, True, False, True], [False, True, True, True]])
    check_op([(2, 3, 4), (2, 4, 4), (2, 4, 2), bool_mask],
             lambda q, k, v, m: it.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3), atol=1e-5)
    float_mask = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    check_op([(2, 3, 4), (2, 4, 4), (2, 4, 2), float_mask],
             lambda q, k, v, m: it.scaled_dot_product_attention(q, k, v, attn_mask=m),
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), atol=1e-5,
             grad_mask=[True, True, True, False])


def test_sdpa_shape_error():
    with pytest.raises(ValueError, match="scaled_dot_product_attention: expected q"):
        it.scaled_dot_product_attention(it.ones(2, 3, 4), it.ones(2, 3, 5), it.ones(2, 3, 4))
