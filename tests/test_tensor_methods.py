"""Tensor methods users reach for when training transformers, each against torch: new_* constructors, type_as,
view_as / expand_as / reshape_as, repeat, masked_fill_ / clamp_, all / any, sum(dtype=), mean's dtype rule,
to(other), div rounding modes."""
import numpy as np
import pytest
import torch

import infini_train as it
from tests.op_check import check_op
from tests.torch_parity import grads, same

RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 3)).astype(np.float32)


def test_new_constructors_take_dtype_and_device_from_the_tensor():
    def run(m):
        base = m.tensor(X, dtype=m.float64)
        return (base.new_zeros(2, 2), base.new_ones((3,)), base.new_full((2,), 7), base.new_empty(0, 2),
                base.new_zeros(2, dtype=m.int32), base.new_tensor([1, 2]))

    same(run)
    made = it.ones(2, device="cpu:1").new_zeros(3)
    assert made.device == it.device("cpu:1") and not it.ones(2, requires_grad=True).new_ones(1).requires_grad


def test_type_as_view_as_reshape_as_expand_as_and_to_other():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        other = m.zeros(3, 2, dtype=m.float64)
        a = x.type_as(other)
        b = x.view_as(other)
        c = x.reshape_as(m.zeros(6))
        d = x[:, :1].expand_as(x)
        e = x.to(other)
        (a.sum() + (b * 2).sum() + (c * 3).sum() + (d * 4).sum() + (e * 5).sum()).backward()
        return a, b, c, d, e, x.grad

    same(run)


@pytest.mark.parametrize("sizes", [(2, 1), (1, 3), (2, 2, 3), (3, 1, 1), (2, 0)], ids=str)
def test_repeat_matches_torch(sizes):
    check_op([(2, 3)], lambda x: x.repeat(*sizes), lambda x: x.repeat(*sizes))
    check_op([(2, 3)], lambda x: x.repeat(sizes), lambda x: x.repeat(sizes))


def test_repeat_errors():
    with pytest.raises(ValueError, match="repeat: expected at least 2 repeat counts"):
        it.ones(2, 3).repeat(2)


def test_masked_fill_and_clamp_in_place_with_gradients():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        y = x * 3
        y.masked_fill_(m.tensor([[True, False, True]]), -1.0).clamp_(min=-0.5, max=2.0)
        (y * m.arange(6.0).reshape(2, 3)).sum().backward()
        return y, x.grad

    same(run)
    same(lambda m: m.tensor(X).clip_(-0.1, 0.1))


@pytest.mark.parametrize("name", ["all", "any"])
def test_all_any(name):
    data = [[0, 1, 2], [3, 4, 5], [0, 0, 0]]
    same(lambda m: (getattr(m.tensor(data), name)(), getattr(m.tensor(data), name)(1),
                    getattr(m.tensor(data), name)(dim=0, keepdim=True), getattr(m, name)(m.tensor(data) > 2)))
    same(lambda m: getattr(m.tensor(X) > 0, name)(-1))


def test_sum_dtype_and_integer_sums_like_torch():
    same(lambda m: (m.tensor([1, 2, 3], dtype=m.int32).sum(), m.tensor([True, True]).sum(),
                    m.tensor([200, 100], dtype=m.uint8).sum(), m.tensor([1, 2], dtype=m.int32).sum(dtype=m.float64)))
    check_op([(2, 3)], lambda x: x.sum(1, dtype=it.float64), lambda x: x.sum(1, dtype=torch.float64))
    check_op([(2, 3)], lambda x: x.mean(dtype=it.float64), lambda x: x.mean(dtype=torch.float64))


def test_mean_of_integers_needs_a_dtype_like_torch():
    with pytest.raises(RuntimeError):
        torch.tensor([1, 2]).mean()
    with pytest.raises(ValueError, match="(?s)mean: expected a floating-point input.*int64.*HINT"):
        it.tensor([1, 2]).mean()
    same(lambda m: m.tensor([1, 2]).mean(dtype=m.float32))


def test_div_rounding_modes_and_their_zero_gradient():
    def run(m):
        a = m.tensor([[-7.5, 7.5, -3.0]], requires_grad=True)
        outs = [a.div(2, rounding_mode=mode) for mode in ("trunc", "floor")]
        outs.append(m.div(m.tensor([-7, 7, -3]), 2, rounding_mode="trunc"))
        (outs[0] + outs[1]).sum().backward()
        return outs, a.grad

    same(run)
    with pytest.raises(ValueError, match="div: expected rounding_mode None, 'trunc' or 'floor'"):
        it.ones(2).div(2, rounding_mode="round")


def test_floor_divide_is_not_differentiable_like_torch():
    for m in (it, torch):
        x = m.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError, match="derivative .*floor_divide.* not implemented"):
            (x // 2).sum().backward()


def test_remainder_gradient_matches_torch():
    check_op([(2, 3), (2, 3)], lambda a, b: a % (b.abs() + 0.5), lambda a, b: a % (b.abs() + 0.5), fd=False)
    same(lambda m: (m.tensor([-7, 7, 5]) % m.tensor([3, -3, 5]), 7.5 % m.tensor([2.0, -2.0])))


def test_square_abs_pos_and_mT():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        out = x.square() + abs(x) + (+x) * x.mT.mT
        out.sum().backward()
        return out, grads(x)

    same(run)


def test_sorting_scan_and_batched_matmul_methods():
    a, b = RNG.standard_normal((2, 3, 4)).astype(np.float32), RNG.standard_normal((2, 4, 5)).astype(np.float32)

    def run(m):
        x = m.tensor(a, requires_grad=True)
        y = m.tensor(b, requires_grad=True)
        values, indices = x.sort(dim=1, descending=True)
        top = x.topk(2, dim=-1)
        out = (values * 2).sum() + top.values.sum() + x.cumsum(0).sum() + x.cumprod(2).sum()
        prod = x.bmm(y) + m.zeros(2, 3, 5).baddbmm(x, y, beta=0.5, alpha=2) + x[0].mm(y[1]).unsqueeze(0)
        (out + prod.sum()).backward()
        return values, indices, top.indices, x.argsort(-1), prod, grads(x, y)

    same(run, rtol=1e-5)


def test_functional_pad_and_one_hot():
    same(lambda m: (m.nn.functional.pad(m.tensor(X), (1, 2), value=-1.0),
                    m.nn.functional.pad(m.tensor(X)[None], (1, 1), mode="reflect"),
                    m.nn.functional.one_hot(m.tensor([0, 2, 1]), 4)))


X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
X12 = RNG.standard_normal((2, 12)).astype(np.float32)


def test_layout_and_size_queries():
    def run(m):
        x = m.tensor(X3)
        picked = (x, x.transpose(0, 2), x[:, 1], x[..., :1], m.zeros(3, dtype=m.float16), m.tensor(5, dtype=m.int64),
                  m.zeros(0, 2), x.double().unsqueeze(1))
        return [(t.is_contiguous(), t.is_contiguous(memory_format=m.contiguous_format), t.stride(), t.is_meta,
                 t.is_floating_point(), t.element_size(), t.itemsize, t.nbytes, t.dim(), t.ndimension(),
                 t.nelement()) for t in picked] + [x.stride(-1), x.transpose(0, 2).stride(0)]

    same(run)


def test_storage_offset_counts_elements_into_the_viewed_storage():
    def run(m):
        x = m.arange(20.0).reshape(4, 5)
        views = (x, x[2:, 1:], x.t()[1:], x[:, 2], x[1:].contiguous(), x[1:].clone(), m.arange(10.0)[3:][2:])
        return [v.storage_offset() for v in views]

    same(run)


def test_meta_tensors_report_torch_layout():
    def run(m):
        t = m.empty(2, 3, 4, device="meta").transpose(0, 2)
        c = m.empty(2, 3, device="meta")
        return c.is_meta, c.is_contiguous(), c.stride(), c.nbytes, c.stride(1), t.is_meta

    same(run)


def test_unflatten_with_inferred_size_and_gradient():
    def run(m):
        x = m.tensor(X12, requires_grad=True)
        a = x.unflatten(1, (3, -1))
        b = m.unflatten(x, -1, [2, 2, 3])
        c = x.unflatten(0, (2, 1))
        d = m.nn.Unflatten(1, (4, 3))(x)
        (a.sum() + (b * 2).sum() + (c * 3).sum() + (d ** 2).sum()).backward()
        return a, b, c, d, x.grad, repr(m.nn.Unflatten(1, (4, 3)))

    same(run)


@pytest.mark.parametrize("sizes, message", [((4, -1), "multiply up to the size of dim 1"), ((), "non-empty"),
                                            ((-1, -1), "only one dimension can be inferred")])
def test_unflatten_errors_say_what_was_expected(sizes, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ones(2, 6).unflatten(1, sizes)
    with pytest.raises(ValueError, match=message):
        it.ones(2, 6).unflatten(1, sizes)


def test_memory_formats_other_than_contiguous_are_refused():
    with pytest.raises(ValueError, match="expected memory_format=infini_train.contiguous_format"):
        it.ones(2).is_contiguous(memory_format=it.channels_last)
    assert it.ones(2, 3).contiguous(memory_format=it.contiguous_format).is_contiguous()
