"""Recurrent layers and cells against torch.nn holding the same weights (loaded from torch's state dict by name):
outputs, final states and the gradients of the input, the initial states and every parameter; variable lengths
against torch's packed sequences; the fused cell ops against torch formulas and float64 finite differences."""
import math

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import infini_train as it
from infini_train import nn
from infini_train.autograd.ops.rnn_cells import SharedStepWeights, gru_cell, lstm_cell, rnn_cell, unbind_steps
from tests.op_check import check_op

RTOL, ATOL = 1e-5, 1e-6
LAYERS = {"rnn_tanh": (nn.RNN, torch.nn.RNN, {"nonlinearity": "tanh"}),
          "rnn_relu": (nn.RNN, torch.nn.RNN, {"nonlinearity": "relu"}),
          "lstm": (nn.LSTM, torch.nn.LSTM, {}),
          "gru": (nn.GRU, torch.nn.GRU, {})}


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def load_from_torch(ours, theirs):
    ours.load_state_dict({k: it.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def pair(kind, *args, seed=0, **kwargs):
    ours_cls, theirs_cls, extra = LAYERS[kind]
    torch.manual_seed(seed)
    theirs = theirs_cls(*args, **extra, **kwargs)
    ours = ours_cls(*args, **extra, **kwargs)
    load_from_torch(ours, theirs)
    return ours, theirs


def flat(result):
    """(output, h_n) or (output, (h_n, c_n)) as a flat list."""
    out, state = result
    return [out, *state] if isinstance(state, tuple) else [out, state]


def assert_close(got, expect, what, rtol=RTOL, atol=ATOL):
    expect = expect.detach().numpy() if isinstance(expect, torch.Tensor) else expect
    assert tuple(got.shape) == tuple(expect.shape), f"{what}: shape {tuple(got.shape)} vs torch {expect.shape}"
    np.testing.assert_allclose(got.numpy(), expect, rtol=rtol, atol=atol, err_msg=what)


def compare(ours, theirs, x, states=(), lengths=None, rtol=RTOL, atol=ATOL):
    """Run both on x (and initial states), backprop random cotangents from every output, compare all."""
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    si = [it.tensor(s, requires_grad=True) for s in states]
    st = [torch.tensor(s, requires_grad=True) for s in states]
    hx_i = None if not states else (tuple(si) if len(si) == 2 else si[0])
    hx_t = None if not states else (tuple(st) if len(st) == 2 else st[0])
    got = flat(ours(xi, hx_i) if lengths is None else ours(xi, hx_i, lengths=lengths))
    if lengths is None:
        expect = flat(theirs(xt, hx_t))
    else:
        host_lengths = torch.tensor(lengths.numpy() if isinstance(lengths, it.Tensor) else lengths)
        packed = pack_padded_sequence(xt, host_lengths, batch_first=theirs.batch_first, enforce_sorted=False)
        out, state = theirs(packed, hx_t)
        padded, _ = pad_packed_sequence(out, batch_first=theirs.batch_first, total_length=x.shape[1 if
                                        theirs.batch_first else 0])
        expect = flat((padded, state))
    assert len(got) == len(expect)
    for k, (g, e) in enumerate(zip(got, expect)):
        assert_close(g, e, f"output {k}", rtol, atol)
    cots = [randn(*e.shape, seed=10 + k) for k, e in enumerate(expect)]
    it.autograd.backward(got, [it.tensor(c) for c in cots])
    torch.autograd.backward(expect, [torch.tensor(c) for c in cots])
    assert_close(xi.grad, xt.grad, "input gradient", rtol, atol)
    for k, (a, b) in enumerate(zip(si, st)):
        assert_close(a.grad, b.grad, f"initial state {k} gradient", rtol, atol)
    theirs_params = dict(theirs.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(theirs_params)
    for n, p in ours.named_parameters():
        assert_close(p.grad, theirs_params[n].grad, f"gradient of {n}", rtol, atol)
    return got


def state_shape(kind, layers, directions, batch, hidden, proj=0):
    h = (layers * directions, batch, proj or hidden) if batch else (layers * directions, proj or hidden)
    if kind != "lstm":
        return [h]
    return [h, h[:-1] + (hidden,)]


# ------------------------------------------------------------------------------------------- layers
@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_matches_torch(kind, num_layers, bidirectional):
    ours, theirs = pair(kind, 5, 6, num_layers=num_layers, bidirectional=bidirectional)
    out = compare(ours, theirs, randn(7, 3, 5))[0]
    assert tuple(out.shape) == (7, 3, 6 * (2 if bidirectional else 1))


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_with_initial_states(kind, batch_first, bias):
    ours, theirs = pair(kind, 4, 5, num_layers=2, bidirectional=True, batch_first=batch_first, bias=bias, seed=1)
    x = randn(3, 6, 4, seed=2) if batch_first else randn(6, 3, 4, seed=2)
    states = [randn(*s, seed=3 + k) for k, s in enumerate(state_shape(kind, 2, 2, 3, 5))]
    compare(ours, theirs, x, states)


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("with_state", [False, True])
def test_unbatched_input(kind, with_state):
    ours, theirs = pair(kind, 4, 3, num_layers=2, bidirectional=True, seed=4)
    states = [randn(*s, seed=5 + k) for k, s in enumerate(state_shape(kind, 2, 2, None, 3))] if with_state else []
    got = compare(ours, theirs, randn(5, 4, seed=6), states)
    assert tuple(got[0].shape) == (5, 6) and tuple(got[1].shape) == (4, 3)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_projections(bidirectional):
    ours, theirs = pair("lstm", 4, 6, num_layers=2, proj_size=3, bidirectional=bidirectional, seed=7)
    directions = 2 if bidirectional else 1
    assert tuple(ours.weight_hr_l1.shape) == (3, 6) and tuple(ours.weight_ih_l1.shape) == (24, 3 * directions)
    states = [randn(*s, seed=8 + k) for k, s in enumerate(state_shape("lstm", 2, directions, 2, 6, proj=3))]
    got = compare(ours, theirs, randn(5, 2, 4, seed=9), states)
    assert tuple(got[0].shape) == (5, 2, 3 * directions) and tuple(got[2].shape) == (2 * directions, 2, 6)


def test_float64_layers_match_torch_closely():
    for kind in LAYERS:
        ours, theirs = pair(kind, 3, 4, num_layers=2, bidirectional=True, seed=11)
        ours.to(it.float64)
        theirs.double()
        compare(ours, theirs, np.random.default_rng(12).standard_normal((6, 2, 3)), rtol=1e-12, atol=1e-13)


# ----------------------------------------------------------------------------------- variable lengths
@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_match_torch_packed_sequences(kind, batch_first):
    ours, theirs = pair(kind, 3, 4, num_layers=2, bidirectional=True, batch_first=batch_first, seed=13)
    lengths = [4, 6, 1, 3]
    x = randn(4, 6, 3, seed=14) if batch_first else randn(6, 4, 3, seed=14)
    states = [randn(*s, seed=15 + k) for k, s in enumerate(state_shape(kind, 2, 2, 4, 4))]
    got = compare(ours, theirs, x, states, lengths=lengths)
    out = got[0].numpy() if not batch_first else got[0].numpy().transpose(1, 0, 2)
    for b, n in enumerate(lengths):
        assert not out[n:, b].any(), "outputs past a sequence's length must be zero"


def test_lengths_without_initial_state_and_as_tensor():
    ours, theirs = pair("lstm", 3, 4, bidirectional=True, seed=16)
    compare(ours, theirs, randn(5, 3, 3, seed=17), lengths=it.tensor(np.array([2, 5, 3])))


def test_full_lengths_equal_no_lengths():
    ours, _ = pair("gru", 3, 4, bidirectional=True, seed=18)
    x = it.tensor(randn(5, 2, 3, seed=19))
    a, b = ours(x), ours(x, lengths=[5, 5])
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())


def test_zero_length_keeps_the_initial_state():
    ours, _ = pair("rnn_tanh", 2, 3, bidirectional=True, seed=20)
    h0 = it.tensor(randn(2, 2, 3, seed=21))
    out, h_n = ours(it.tensor(randn(4, 2, 2, seed=22)), h0, lengths=[0, 4])
    assert not out.numpy()[:, 0].any()
    np.testing.assert_array_equal(h_n.numpy()[:, 0], h0.numpy()[:, 0])


# ------------------------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("kind", list(LAYERS))
def test_dropout_in_eval_mode_equals_torch(kind):
    ours, theirs = pair(kind, 3, 4, num_layers=3, dropout=0.5, seed=23)
    ours.eval()
    theirs.eval()
    compare(ours, theirs, randn(5, 2, 3, seed=24))


def test_dropout_between_layers_in_training_mode():
    """Layer 1 is relu(I x): its output is layer 0's output after dropout, which must be 0 or scaled by 1/(1-p)."""
    p, hidden = 0.3, 64
    layer = nn.RNN(8, hidden, num_layers=2, nonlinearity="relu", dropout=p)
    with it.no_grad():
        layer.weight_ih_l0.copy_(it.tensor(np.abs(randn(hidden, 8, seed=25))))
        layer.bias_ih_l0.fill_(0.1)
        layer.weight_hh_l0.zero_()
        layer.weight_ih_l1.copy_(it.tensor(np.eye(hidden, dtype=np.float32)))
        for name in ("weight_hh_l1", "bias_ih_l1", "bias_hh_l1", "bias_hh_l0"):
            getattr(layer, name).zero_()
    x = it.tensor(np.abs(randn(40, 16, 8, seed=26)))
    layer.eval()
    reference = layer(x)[0].numpy()
    assert (reference > 0).all()
    layer.train()
    it.manual_seed(0)
    ratio = layer(x)[0].numpy() / reference
    dropped = np.isclose(ratio, 0.0)
    assert np.allclose(ratio[~dropped], 1 / (1 - p), rtol=1e-5)
    assert abs(dropped.mean() - p) < 0.02, dropped.mean()
    with pytest.warns(UserWarning, match="no effect"):
        nn.LSTM(3, 4, dropout=0.5)


# ------------------------------------------------------------------------------------------- cells
CELLS = {"rnn_tanh": (nn.RNNCell, torch.nn.RNNCell, {"nonlinearity": "tanh"}),
         "rnn_relu": (nn.RNNCell, torch.nn.RNNCell, {"nonlinearity": "relu"}),
         "lstm": (nn.LSTMCell, torch.nn.LSTMCell, {}),
         "gru": (nn.GRUCell, torch.nn.GRUCell, {})}


@pytest.mark.parametrize("kind", list(CELLS))
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_cells_match_torch(kind, batched, with_state, bias):
    ours_cls, theirs_cls, extra = CELLS[kind]
    torch.manual_seed(27)
    theirs = theirs_cls(5, 4, bias=bias, **extra)
    ours = ours_cls(5, 4, bias=bias, **extra)
    load_from_torch(ours, theirs)
    shape = (3, 4) if batched else (4,)
    states = [randn(*shape, seed=28 + k) for k in range(2 if kind == "lstm" else 1)] if with_state else []
    x = randn(*((3, 5) if batched else (5,)), seed=30)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    si = [it.tensor(s, requires_grad=True) for s in states]
    st = [torch.tensor(s, requires_grad=True) for s in states]
    hx_i = (tuple(si) if kind == "lstm" else si[0]) if states else None
    hx_t = (tuple(st) if kind == "lstm" else st[0]) if states else None
    got, expect = ours(xi, hx_i), theirs(xt, hx_t)
    got, expect = (list(got), list(expect)) if kind == "lstm" else ([got], [expect])
    for k, (g, e) in enumerate(zip(got, expect)):
        assert_close(g, e, f"cell output {k}")
    cots = [randn(*e.shape, seed=31 + k) for k, e in enumerate(expect)]
    it.autograd.backward(got, [it.tensor(c) for c in cots])
    torch.autograd.backward(expect, [torch.tensor(c) for c in cots])
    assert_close(xi.grad, xt.grad, "input gradient")
    for k, (a, b) in enumerate(zip(si, st)):
        assert_close(a.grad, b.grad, f"state {k} gradient")
    theirs_params = dict(theirs.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(theirs_params)
    for n, p in ours.named_parameters():
        assert_close(p.grad, theirs_params[n].grad, f"gradient of {n}")


# ------------------------------------------------------------------------------------------- fused ops
def torch_lstm_cell(gi, gh, c):
    i, f, g, o = (gi + gh).chunk(4, -1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def torch_gru_cell(gi, gh, h):
    hidden = h.shape[-1]
    r, z = torch.sigmoid(gi[:, :2 * hidden] + gh[:, :2 * hidden]).chunk(2, -1)
    n = torch.tanh(gi[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
    return (h - n) * z + n


def test_lstm_cell_op_against_torch_and_finite_differences():
    check_op([(3, 16), (3, 16), (3, 4)], lstm_cell, torch_lstm_cell)


def test_gru_cell_op_against_torch_and_finite_differences():
    check_op([(3, 12), (3, 12), (3, 4)], gru_cell, torch_gru_cell)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_cell_op_against_torch_and_finite_differences(nonlinearity):
    act = torch.tanh if nonlinearity == "tanh" else torch.relu
    check_op([(3, 5), (3, 5)], lambda a, b: rnn_cell(a, b, nonlinearity), lambda a, b: act(a + b))


def test_shared_step_weights_against_torch_and_finite_differences():
    """Three chained steps through one SharedStepWeights: the first step's backward gathers the later ones."""
    def ours(h, w, b):
        shared = SharedStepWeights(w, b)
        for _ in range(3):
            h = shared(h).tanh()
        return h

    def theirs(h, w, b):
        for _ in range(3):
            h = torch.nn.functional.linear(h, w, b).tanh()
        return h

    check_op([(2, 4), (4, 4), (4,)], ours, theirs, low=-0.8, high=0.8)


def test_unbind_steps_against_torch_and_finite_differences():
    check_op([(4, 2, 3)], unbind_steps, lambda x: x.unbind(0))


def test_lstm_cell_op_gradient_of_the_cell_state_alone():
    """Only c' used downstream: the zero gradient of h' must be filled in, not dropped."""
    check_op([(2, 8), (2, 8), (2, 2)], lambda a, b, c: lstm_cell(a, b, c)[1],
             lambda a, b, c: torch_lstm_cell(a, b, c)[1])


def test_cell_ops_reject_mismatched_gate_widths():
    with pytest.raises(ValueError, match=r"lstm_cell: expected gi and gh .*4 \* hidden(.|\n)*HINT"):
        lstm_cell(it.zeros(2, 12), it.zeros(2, 12), it.zeros(2, 4))
    with pytest.raises(ValueError, match=r"gru_cell: expected"):
        gru_cell(it.zeros(2, 12), it.zeros(2, 9), it.zeros(2, 4))


# --------------------------------------------------------------------------- names, init, state dicts, errors
@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 3, "bidirectional": True}, {"bias": False, "num_layers": 2},
                                    {"proj_size": 2, "bidirectional": True, "num_layers": 2}])
def test_parameter_names_shapes_and_repr_match_torch(kwargs):
    it.manual_seed(1)  # the spread check below holds for this draw (5 uniform values can bunch together)
    for kind in LAYERS if "proj_size" not in kwargs else ["lstm"]:
        ours_cls, theirs_cls, extra = LAYERS[kind]
        ours, theirs = ours_cls(3, 5, **extra, **kwargs), theirs_cls(3, 5, **extra, **kwargs)
        assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
               [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
        assert repr(ours) == repr(theirs)
        bound = 1 / math.sqrt(5)
        for n, p in ours.named_parameters():
            values = p.numpy()
            assert (np.abs(values) <= bound).all() and values.std() > 0.2 * bound, n


def test_cell_repr_matches_torch():
    assert repr(nn.RNNCell(3, 4, bias=False, nonlinearity="relu")) == repr(torch.nn.RNNCell(3, 4, False, "relu"))
    assert repr(nn.LSTMCell(3, 4)) == repr(torch.nn.LSTMCell(3, 4))


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_state_dict_round_trip_torch_ours_torch():
    ours, theirs = pair("lstm", 3, 4, num_layers=2, bidirectional=True, proj_size=2, seed=32)
    back = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2)
    back.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()}, strict=True)
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v, rtol=0, atol=0)
    x = randn(4, 2, 3, seed=33)
    np.testing.assert_allclose(ours(it.tensor(x))[0].numpy(), back(torch.tensor(x))[0].detach().numpy(),
                               rtol=RTOL, atol=ATOL)


def test_input_errors_name_the_layer_and_hint():
    lstm = nn.LSTM(3, 4, num_layers=2)
    with pytest.raises(ValueError, match=r"LSTM: expected input of shape \(L, N, H_in\) .* got shape \(2, 3, 5\)"):
        lstm(it.zeros(2, 3, 5))
    with pytest.raises(ValueError, match=r"LSTM: (.|\n)*got shape \(2, 3, 3, 3\)(.|\n)*HINT"):
        lstm(it.zeros(2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"LSTM: expected h_0 of shape \(2, 3, 4\), got shape \(1, 3, 4\)"):
        lstm(it.zeros(5, 3, 3), (it.zeros(1, 3, 4), it.zeros(2, 3, 4)))
    with pytest.raises(ValueError, match=r"LSTM: expected c_0 of shape \(2, 4\)"):
        lstm(it.zeros(5, 3), (it.zeros(2, 4), it.zeros(2, 3, 4)))
    with pytest.raises(TypeError, match=r"LSTM: expected hx as a tuple \(h_0, c_0\)(.|\n)*HINT"):
        lstm(it.zeros(5, 3, 3), it.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"GRU: expected lengths as 3 integers in \[0, 5\](.|\n)*HINT"):
        nn.GRU(3, 4)(it.zeros(5, 3, 3), lengths=[1, 6, 2])
    with pytest.raises(ValueError, match=r"GRU: expected lengths"):
        nn.GRU(3, 4)(it.zeros(5, 3, 3), lengths=[1, 2])
    with pytest.raises(ValueError, match=r"RNN: expected input of the parameters' dtype float32, got float64"):
        nn.RNN(3, 4)(it.zeros(5, 3, 3, dtype=it.float64))
    with pytest.raises(ValueError, match=r"GRUCell: expected input of shape \(N, 3\)(.|\n)*HINT"):
        nn.GRUCell(3, 4)(it.zeros(2, 4))
    with pytest.raises(ValueError, match=r"LSTMCell: expected c of shape \(2, 4\), got shape \(2, 5\)"):
        nn.LSTMCell(3, 4)(it.zeros(2, 3), (it.zeros(2, 4), it.zeros(2, 5)))


def test_constructor_errors():
    with pytest.raises(ValueError, match="RNN: expected nonlinearity 'tanh' or 'relu'"):
        nn.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="GRU: expected hidden_size to be a positive integer"):
        nn.GRU(3, 0)
    with pytest.raises(ValueError, match=r"LSTM: expected proj_size < hidden_size(.|\n)*HINT"):
        nn.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match=r"LSTM: expected dropout in \[0, 1\]"):
        nn.LSTM(3, 4, num_layers=2, dropout=1.5)


# ------------------------------------------------------------------------- the shared step-weight gradient
def test_backward_twice_with_retain_graph_doubles_every_gradient():
    ours, _ = pair("lstm", 3, 4, num_layers=2, bidirectional=True, seed=34)
    x = it.tensor(randn(5, 2, 3, seed=35), requires_grad=True)
    out, (h_n, _) = ours(x)
    loss = (out * it.tensor(randn(5, 2, 8, seed=36))).sum() + h_n.sum()
    loss.backward(retain_graph=True)
    once = {n: p.grad.numpy().copy() for n, p in ours.named_parameters()}
    once_x = x.grad.numpy().copy()
    loss.backward()
    for n, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), 2 * once[n], rtol=1e-6, atol=1e-7, err_msg=n)
    np.testing.assert_allclose(x.grad.numpy(), 2 * once_x, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_gradient_of_one_middle_step_only(kind):
    """Steps after the used output get no gradient at all; the weight gradient still covers the steps before."""
    ours, theirs = pair(kind, 3, 4, num_layers=2, seed=37)
    x = randn(6, 2, 3, seed=38)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours(xi)[0][2].sum().backward()
    theirs(xt)[0][2].sum().backward()
    assert_close(xi.grad, xt.grad, "input gradient")
    theirs_params = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        assert_close(p.grad, theirs_params[n].grad, f"gradient of {n}")


def test_frozen_parameters_still_give_input_gradients():
    ours, theirs = pair("gru", 3, 4, bidirectional=True, seed=39)
    for p in ours.parameters():
        p.requires_grad = False
    x = randn(4, 2, 3, seed=40)
    xi, xt = it.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    ours(xi)[0].sum().backward()
    theirs(xt)[0].sum().backward()
    assert_close(xi.grad, xt.grad, "input gradient")
    assert all(p.grad is None for p in ours.parameters())


def test_no_grad_forward_equals_recorded_forward():
    ours, _ = pair("lstm", 3, 4, bidirectional=True, seed=41)
    x = it.tensor(randn(4, 2, 3, seed=42))
    with it.no_grad():
        plain = ours(x, lengths=[4, 2])[0]
    np.testing.assert_array_equal(plain.numpy(), ours(x, lengths=[4, 2])[0].numpy())
    assert plain.grad_fn is None


@pytest.mark.cuda
@pytest.mark.skipif(not it.backend.cuda_available(), reason="needs cupy and an NVIDIA GPU")
@pytest.mark.parametrize("kind", list(LAYERS))
def test_layers_on_gpu_match_cpu(kind):
    cpu, _ = pair(kind, 3, 4, num_layers=2, bidirectional=True, seed=43)
    gpu, _ = pair(kind, 3, 4, num_layers=2, bidirectional=True, seed=43)
    gpu.to("cuda:0")
    x = randn(5, 2, 3, seed=44)
    results = []
    for layer, device in ((cpu, "cpu"), (gpu, "cuda:0")):
        xi = it.tensor(x, device=device, requires_grad=True)
        out = flat(layer(xi, lengths=[5, 3]))
        it.autograd.backward(out, [it.ones_like(o) for o in out])
        results.append([o.cpu().numpy() for o in out] + [xi.grad.cpu().numpy()] +
                       [p.grad.cpu().numpy() for p in layer.parameters()])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
