import pytest

import infini_train as it
from tests.op_check import check_op


@pytest.mark.parametrize("shape,new", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((6,), (2, 1, 3)), ((), (1,))])
def test_reshape_and_view(shape, new):
    check_op([shape], lambda x: x.reshape(new) * 2, lambda x: x.reshape(new) * 2)
    check_op([shape], lambda x: x.view(*new) * 2, lambda x: x.view(*new) * 2)


@pytest.mark.parametrize("d0,d1", [(0, 1), (0, 2), (-1, -2)])
def test_transpose(d0, d1):
    check_op([(2, 3, 4)], lambda x: x.transpose(d0, d1) * 2, lambda x: x.transpose(d0, d1) * 2)


def test_reshape_bad_size_is_clear():
    with pytest.raises(ValueError, match="Reshape: .*"):
        it.ones(2, 3).reshape(4, 2)
