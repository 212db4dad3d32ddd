"""Views as in torch: view() aliases or raises, reshape() aliases or copies, writes through views reach the base
and the gradients follow (CopySlices / view regeneration), and indexing refuses device mixes."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd.ops.transform import view_strides
from tests.torch_parity import grads, same

RNG = np.random.default_rng(1)
X = RNG.standard_normal((3, 4)).astype(np.float32)
W = RNG.standard_normal((3, 4)).astype(np.float32)


# ------------------------------------------------------------------------------------- view vs reshape
def test_reshape_of_a_transpose_is_a_copy_and_base_changes_do_not_conflict():
    def run(m):
        base = m.tensor(X[:2, :3])
        flat = base.t().reshape(6)
        base.add_(1)  # a copy shares no version: no false "modified by an inplace operation"
        return flat, base

    same(run)


def test_view_of_incompatible_strides_raises_like_torch():
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        torch.tensor(X).t().view(12)
    with pytest.raises(ValueError, match=r"(?s)view: .*view size is not compatible.*Use .reshape\(...\) instead"):
        it.tensor(X).t().view(12)


def test_view_and_contiguous_reshape_alias_the_base():
    def run(m):
        base = m.tensor(X)
        v = base.view(2, 6)
        r = base.reshape(4, 3)
        v[0, 0] = 100.0
        r[-1, -1] = -100.0
        f = base.t().flatten()  # a copy: not written through
        f[0] = 55.0
        return base, v, r

    same(run)


def test_reshape_view_rule_matches_torch_on_random_strided_tensors():
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        shape = tuple(int(n) for n in rng.integers(1, 4, size=rng.integers(1, 4)))
        big = tuple(n * 2 for n in shape)
        full = torch.arange(float(np.prod(big))).reshape(big)
        ours_full = it.arange(float(np.prod(big))).reshape(big)
        index = tuple(slice(0, None, int(s)) for s in rng.integers(1, 3, size=len(shape)))
        perm = tuple(int(p) for p in rng.permutation(len(shape)))
        theirs = full[index].permute(perm)
        ours = ours_full[index].permute(perm)
        target = tuple(int(n) for n in rng.permutation(theirs.shape))
        target = (theirs.numel(),) if rng.random() < 0.3 else target
        try:
            torch_view = theirs.view(target)
        except RuntimeError:
            torch_view = None
        strides = view_strides(ours.shape, ours.array.strides, target)
        assert (strides is None) == (torch_view is None), f"{theirs.shape} {theirs.stride()} -> {target}"
        if torch_view is not None:
            got = ours.view(target)
            assert np.shares_memory(got.array, ours_full.array)
            np.testing.assert_array_equal(got.numpy(), torch_view.numpy())
            checked += 1
        np.testing.assert_array_equal(ours.reshape(target).numpy(), theirs.reshape(target).numpy())
    assert checked > 50


# -------------------------------------------------------------------------------- writes through views
@pytest.mark.parametrize("case", ["row", "transposed_slice", "reshaped", "sibling_overlap", "base_then_old_view",
                                  "unsqueeze_squeeze", "nested"])
def test_in_place_through_views_gives_torch_gradients(case):
    def run(m):
        x, w = m.tensor(X, requires_grad=True), m.tensor(W, requires_grad=True)
        b = x * 1
        if case == "row":
            b[1].mul_(w[1])
            out = b
        elif case == "transposed_slice":
            b.t()[1:3].mul_(2).add_(w.t()[1:3])
            out = b
        elif case == "reshaped":
            b.view(2, 6)[1].exp_()
            out = b.reshape(12)
        elif case == "sibling_overlap":
            col, row = b[:, 0], b[0]
            row.mul_(3)
            out = col  # col's history is regenerated: it sees row's write at [0, 0]
        elif case == "base_then_old_view":
            v = b[1:]
            b.mul_(w)
            out = v * 2
        elif case == "unsqueeze_squeeze":
            b.unsqueeze(0)[0, 2].add_(w[2] * w[2])
            out = b.squeeze()
        elif case == "nested":
            b[1:][:, 1:].t()[0].mul_(w[0, :2])
            out = b
        (out * m.arange(out.numel()).reshape(out.shape)).sum().backward()
        return out, grads(x, w)

    same(run, rtol=1e-5)


def test_in_place_on_split_and_chunk_pieces_writes_through():
    # torch refuses in-place changes to the outputs of split/chunk (multi-output views); here each piece is an
    # ordinary view of its region, so the result equals torch's with the same regions taken by slicing
    def run(m, pieces):
        x, w = m.tensor(X, requires_grad=True), m.tensor(W, requires_grad=True)
        b = x * 1
        top, bottom, rows = pieces(b)
        bottom.mul_(w[1:])
        rows.view(4).neg_()
        out = top * 3 + b.sum(0)
        (out * m.arange(4)).sum().backward()
        return out, b, grads(x, w)

    ours = run(it, lambda b: (*b.split([1, 2]), b.chunk(3)[2]))
    theirs = run(torch, lambda b: (b[:1], b[1:], b[2:3]))
    from tests.torch_parity import assert_same
    assert_same(ours, theirs, rtol=1e-5)


def test_view_of_a_tensor_without_grad_gains_history_from_its_base():
    def run(m):
        w = m.tensor(W, requires_grad=True)
        buf = m.zeros(3, 4)
        earlier = buf[:, 1:]  # made before the base had any history
        buf[0] = w[0] * 2
        (earlier * 5).sum().backward()
        return earlier.requires_grad, w.grad

    same(run)


def test_double_backward_through_a_write_into_a_view():
    def run(m):
        x = m.tensor(X, requires_grad=True)
        b = x.tanh() * 1  # tanh keeps its output for backward: write into a copy of it
        b[0] = b[0].clone() * x[0]  # without clone both refuse: the write changes the saved b[0]
        (g,) = m.autograd.grad(b.sum(), x, create_graph=True)
        (gg,) = m.autograd.grad(g.sum(), x)
        return g, gg

    same(run, rtol=1e-5)


# -------------------------------------------------------------------------------------- device checks
def test_indexing_refuses_logical_device_mixes():
    x = it.zeros(4, device="cpu:0")
    with pytest.raises(ValueError, match=r"__setitem__: expected a value on the tensor's device \(cpu\), got a value "
                                         r"on cpu:1"):
        x[:2] = it.ones(2, device="cpu:1")
    with pytest.raises(ValueError, match=r"(?s)index: expected index tensors on the indexed tensor's device \(cpu\), "
                                         r"got an index tensor on cpu:1.*HINT"):
        x[it.tensor([0, 1], device="cpu:1")]
    with pytest.raises(ValueError, match="index tensors on the indexed tensor's device"):
        x[it.tensor([0, 1], device="cpu:1")] = 1.0
    with pytest.raises(ValueError, match="__setitem__: expected a value on the tensor's device"):
        (it.zeros(4, device="cpu:0", requires_grad=True) * 1)[:2] = it.ones(2, device="cpu:1", requires_grad=True)
    x[it.tensor([0, 1])] = it.tensor(3.0)  # same device: fine
    np.testing.assert_array_equal(x.numpy(), [3, 3, 0, 0])
    y = it.arange(4.0, device="cpu:1")  # a host index for a logical device's tensor, as torch for a GPU's
    np.testing.assert_array_equal(y[it.tensor([2, 2, 0])].numpy(), [2, 2, 0])


# --------------------------------------------------------------------------------------- clear errors
def test_setitem_broadcast_error_names_both_shapes():
    with pytest.raises(ValueError, match=r"(?s)__setitem__: expected a value broadcastable to the indexed shape "
                                         r"\(2, 4\), got a value of shape \(3,\).*HINT"):
        it.zeros(3, 4)[:2] = it.ones(3)
    with pytest.raises(ValueError, match=r"__setitem__: expected indices valid for a tensor of shape \(3, 4\)"):
        it.zeros(3, 4)[5] = 1.0


def test_transpose_dim_out_of_range_is_clear():
    with pytest.raises(ValueError, match=r"(?s)transpose: expected dims in \[-2, 1\] for a 2-d tensor, got dim0=0, "
                                         r"dim1=2.*HINT"):
        it.ones(2, 3).transpose(0, 2)
    same(lambda m: m.ones(2, 3, 4).transpose(-1, 0))


def test_ragged_nested_list_is_clear():
    with pytest.raises(ValueError, match=r"(?s)tensor: expected .*rectangular.*data\[0\] has 2 items, data\[1\] has "
                                         r"1 items.*HINT"):
        it.tensor([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"data\[0\]\[0\] has 2 items, data\[1\]\[0\] has 1 items"):
        it.tensor([[[1, 2], [3, 4]], [[1], [2]]])
