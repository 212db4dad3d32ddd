"""Gradients summed at a node: in place when the engine alone holds the first one; an embedding's weight gradient
as row updates added into a tied weight's other gradient. Values against torch, bits against separate passes."""
import numpy as np
import pytest
import torch

import infini_train as it
from infini_train.autograd import function, grad_sum

V, C = 50, 8


def _tied(padding_idx=None, lib=it):
    """A tied embedding / output layer: the weight, the embedding's part of the loss, the output layer's."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((V, C)).astype(np.float32)
    ids = rng.integers(0, V, size=(3, 7))
    ids[0, :3] = 4  # repeated ids
    probe = rng.standard_normal((5, C)).astype(np.float32)
    if lib is it:
        w = it.nn.Parameter(it.tensor(weight))
        h = it.nn.functional.embedding(it.tensor(ids), w, padding_idx=padding_idx)
        logits = it.nn.functional.linear(it.tensor(probe), w)
    else:
        w = torch.nn.Parameter(torch.tensor(weight))
        h = torch.nn.functional.embedding(torch.tensor(ids), w, padding_idx=padding_idx)
        logits = torch.nn.functional.linear(torch.tensor(probe), w)
    return w, (h * h).sum() * 0.5, (logits * logits).sum() * 0.25


def _total(emb_part, lin_part, emb_first):
    """The engine runs the last operand's branch first: it is the first to reach the weight."""
    return lin_part + emb_part if emb_first else emb_part + lin_part


@pytest.mark.parametrize("padding_idx", [None, 4])
@pytest.mark.parametrize("emb_first", [False, True])
def test_a_tied_weight_gets_both_gradients_bitwise_as_two_separate_passes(emb_first, padding_idx, monkeypatch):
    arrivals = []
    real = grad_sum.add_gradients

    def spy(prev, new, prev_unshared):
        arrivals.append((type(prev).__name__, type(new).__name__))
        return real(prev, new, prev_unshared)

    monkeypatch.setattr(function, "add_gradients", spy)
    w, emb_part, lin_part = _tied(padding_idx)
    _total(emb_part, lin_part, emb_first).backward()
    assert ("RowUpdates", "ndarray") in arrivals if emb_first else ("ndarray", "RowUpdates") in arrivals
    both = w.grad.numpy().copy()
    parts = []
    for pick in (0, 1):
        w, emb_part, lin_part = _tied(padding_idx)
        (emb_part, lin_part)[pick].backward()
        parts.append(w.grad.numpy())
    np.testing.assert_array_equal(both, parts[0] + parts[1])
    tw, temb, tlin = _tied(padding_idx, lib=torch)
    (temb + tlin).backward()
    np.testing.assert_allclose(both, tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    if padding_idx is not None:
        np.testing.assert_array_equal(both[padding_idx], parts[1][padding_idx])  # the output layer's part only


def test_the_row_updates_go_into_the_output_layers_gradient_in_place(monkeypatch):
    added = []
    real = grad_sum.RowUpdates.add_to

    def spy(self, table):
        added.append(table)
        return real(self, table)

    monkeypatch.setattr(grad_sum.RowUpdates, "add_to", spy)
    w, emb_part, lin_part = _tied()
    _total(emb_part, lin_part, emb_first=False).backward()
    assert len(added) == 1 and added[0] is w.grad.array  # no zeros table, no copy: the one array became .grad


def test_two_lookups_of_one_table_and_a_lone_lookup_give_dense_gradients():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((V, C)).astype(np.float32)
    ids1, ids2 = rng.integers(0, V, size=(4, 3)), rng.integers(0, V, size=(2, 5))
    w, tw = it.nn.Parameter(it.tensor(weight)), torch.nn.Parameter(torch.tensor(weight))
    F, TF = it.nn.functional, torch.nn.functional
    ((F.embedding(it.tensor(ids1), w) ** 2).sum() + F.embedding(it.tensor(ids2), w).sum()).backward()
    ((TF.embedding(torch.tensor(ids1), tw) ** 2).sum() + TF.embedding(torch.tensor(ids2), tw).sum()).backward()
    assert isinstance(w.grad.array, np.ndarray)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6, atol=1e-6)
    (g,) = it.autograd.grad((F.embedding(it.tensor(ids1), w) * 3.0).sum(), [w])
    assert isinstance(g.array, np.ndarray) and g.shape == (V, C)
    np.testing.assert_array_equal(g.numpy()[np.unique(ids1)].sum(axis=1) > 0, True)


def test_an_array_someone_else_holds_is_never_added_into():
    x = it.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    y1 = x * 2.0
    y2 = y1 * 3.0
    seed = np.ones((2, 3), np.float32)
    it.autograd.backward([y1, y2], [it.tensor(seed), it.tensor(np.full((2, 3), 2.0, np.float32))])
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0 * (1.0 + 2.0 * 3.0)))
    arrays = [np.ones((2, 3), np.float32)]
    kept = it.tensor(arrays[0])
    y1 = x * 2.0
    it.autograd.backward([y1, y1 * 3.0], [kept, it.tensor(np.ones((2, 3), np.float32))])
    np.testing.assert_array_equal(kept.numpy(), 1.0)  # the caller's seed gradient is untouched


def test_in_place_sums_keep_the_bits_of_new_arrays(monkeypatch):
    """Each layer's input feeds two products: its two gradients are summed in place, then (in place refused)
    into new arrays: the same gradients, torch's values."""
    rng = np.random.default_rng(2)
    a, w1, w2 = (rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(3))
    results, in_place = [], []
    real = grad_sum._in_place_ok
    for allow in (True, False):
        monkeypatch.setattr(grad_sum, "_in_place_ok", lambda array, unshared, allow=allow: in_place.append(
            real(array, unshared)) or in_place[-1] if allow else False)
        x = it.tensor(a, requires_grad=True)
        h = x
        for _ in range(3):
            h = (h @ it.tensor(w1)).tanh() + (h @ it.tensor(w2)).tanh()
        (h * h).sum().backward()
        results.append(x.grad.numpy())
    assert len(in_place) == 4 and all(in_place)  # the sums at x, at the two inner layers and at h * h
    np.testing.assert_array_equal(results[0], results[1])
    tx = torch.tensor(a, requires_grad=True)
    th = tx
    for _ in range(3):
        th = (th @ torch.tensor(w1)).tanh() + (th @ torch.tensor(w2)).tanh()
    (th * th).sum().backward()
    np.testing.assert_allclose(results[0], tx.grad.numpy(), rtol=1e-5, atol=1e-5)
