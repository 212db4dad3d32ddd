"""Recurrent layers with torch.nn's constructor arguments, call signature, outputs and parameter names:
RNN (tanh | relu), LSTM (with optional projections), GRU, and the single-step cells RNNCell, LSTMCell, GRUCell.

Per layer and direction, the input projection x @ W_ih^T + b_ih of every time step is one GEMM; each step then
costs one GEMM (h @ W_hh^T + b_hh) and one fused cell op (autograd/ops/rnn_cells.py). Parameters are named
``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` (and ``weight_hr_l{k}`` for projected
LSTMs), with ``_reverse`` for the backward direction, so torch state dicts load as they are.

Variable lengths without packing: ``forward(input, hx, lengths=...)`` takes one length per sequence. Steps at or
past a sequence's length leave its state unchanged and give zero outputs, so output and h_n are what torch returns
for pack_padded_sequence(input, lengths, enforce_sorted=False) followed by pad_packed_sequence(total_length=L).
The reverse direction starts each sequence at its own last valid step.
"""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from ..autograd.ops.elementwise import where
from ..autograd.ops.joins import cat, stack
from ..autograd.ops.rnn_cells import SharedStepWeights, gru_cell, lstm_cell, rnn_cell, unbind_steps
from ..creation import zeros
from ..tensor import Tensor
from . import functional as F
from . import init
from .layers import _param
from .module import Module

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}
_NONLINEARITY_MODE = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}


def _check_sizes(name, **sizes):
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name}: expected {key} to be a positive integer, got {value!r}")


def _check_dtype(name, x, weight):
    if x.dtype != weight.dtype:
        raise ValueError(f"{name}: expected input of the parameters' dtype {weight.dtype}, got {x.dtype}\n"
                         f"HINT: cast the input with .to({weight.dtype}) or the module with .to(dtype)")


class RNNBase(Module):
    """The stacked (and optionally bidirectional) recurrence shared by RNN, LSTM and GRU; ``mode`` is one of
    "RNN_TANH", "RNN_RELU", "LSTM", "GRU"."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        if mode not in _GATES:
            raise ValueError(f"{name}: unknown mode {mode!r}, expected one of {sorted(_GATES)}")
        _check_sizes(name, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout <= 1:
            raise ValueError(f"{name}: expected dropout in [0, 1] (the probability of zeroing an element between "
                             f"layers), got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{name}: dropout={dropout} has no effect with num_layers=1: dropout is applied to the "
                          "outputs of every layer but the last", stacklevel=2)
        if isinstance(proj_size, bool) or not isinstance(proj_size, numbers.Integral) or proj_size < 0:
            raise ValueError(f"{name}: expected proj_size to be a non-negative integer, got {proj_size!r}")
        if proj_size and mode != "LSTM":
            raise ValueError(f"{name}: proj_size is only supported by LSTM, got proj_size={proj_size}")
        if proj_size >= hidden_size:
            raise ValueError(f"{name}: expected proj_size < hidden_size, got proj_size={proj_size}, "
                             f"hidden_size={hidden_size}\nHINT: use proj_size=0 for no projection")
        self.mode = mode
        self.input_size, self.hidden_size, self.num_layers = int(input_size), int(hidden_size), int(num_layers)
        self.bias, self.batch_first, self.bidirectional = bool(bias), bool(batch_first), bool(bidirectional)
        self.dropout, self.proj_size = float(dropout), int(proj_size)
        directions = 2 if bidirectional else 1
        real_hidden = proj_size or hidden_size
        gate_size = _GATES[mode] * hidden_size
        self._flat_weights_names = []
        self._cell_names = []  # per layer and direction: (w_ih, w_hh, b_ih, b_hh, w_hr), None where absent
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else real_hidden * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = {f"weight_ih{suffix}": (gate_size, layer_input),
                          f"weight_hh{suffix}": (gate_size, real_hidden)}
                if bias:
                    shapes[f"bias_ih{suffix}"] = (gate_size,)
                    shapes[f"bias_hh{suffix}"] = (gate_size,)
                if proj_size:
                    shapes[f"weight_hr{suffix}"] = (proj_size, hidden_size)
                for key, shape in shapes.items():
                    self.register_parameter(key, _param(*shape, device=device, dtype=dtype))
                self._flat_weights_names.extend(shapes)
                self._cell_names.append(tuple(
                    key if key in shapes else None for key in
                    (f"weight_ih{suffix}", f"weight_hh{suffix}", f"bias_ih{suffix}", f"bias_hh{suffix}",
                     f"weight_hr{suffix}")))
        self.reset_parameters()

    def reset_parameters(self):
        """Every weight and bias uniform in +-1/sqrt(hidden_size), as torch."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def flatten_parameters(self):
        """Accepted for torch compatibility: parameters are used as they are, there is no flat buffer."""

    @property
    def all_weights(self):
        return [[getattr(self, key) for key in names if key is not None] for names in self._cell_names]

    # ------------------------------------------------------------------------------------- forward
    def forward(self, input, hx=None, lengths=None):
        """input (L, N, H_in), (N, L, H_in) with batch_first, or (L, H_in) unbatched; hx the initial state(s)
        (zeros when None); lengths: one valid length per sequence (a list, array or int tensor; see the module
        docstring). Returns (output, h_n), or (output, (h_n, c_n)) for LSTM."""
        x, batched = self._time_major_input(input)
        steps, batch = x.shape[0], x.shape[1]
        directions = 2 if self.bidirectional else 1
        h0, c0 = self._initial_states(hx, x, batched, directions * self.num_layers, batch)
        masks = self._step_masks(lengths, steps, batch, batched, x.device)
        h0s = unbind_steps(h0)
        c0s = unbind_steps(c0) if c0 is not None else None
        finals_h, finals_c = [], []
        layer_input = x
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                out, h_last, c_last = self._run_direction(layer_input, k, h0s[k], c0s[k] if c0s else None, masks,
                                                          reverse=direction == 1)
                outputs.append(out)
                finals_h.append(h_last)
                finals_c.append(c_last)
            layer_input = outputs[0] if directions == 1 else cat(outputs, dim=2)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        output, h_n = layer_input, stack(finals_h)
        c_n = stack(finals_c) if self.mode == "LSTM" else None
        if not batched:
            output, h_n = output.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        elif self.batch_first:
            output = output.transpose(0, 1)
        return (output, (h_n, c_n)) if self.mode == "LSTM" else (output, h_n)

    def _run_direction(self, x, k, h, c, masks, reverse):
        """One layer in one direction over x (L, N, in): (outputs (L, N, H_out), last h, last c)."""
        w_ih, w_hh, b_ih, b_hh, w_hr = (None if key is None else getattr(self, key) for key in self._cell_names[k])
        step_inputs = unbind_steps(F.linear(x, w_ih, b_ih))  # every step's input projection in one GEMM
        hidden_map = SharedStepWeights(w_hh, b_hh)  # and every step's weight gradient in one GEMM
        projection = SharedStepWeights(w_hr) if w_hr is not None else None
        outputs = [None] * len(step_inputs)
        order = range(len(step_inputs) - 1, -1, -1) if reverse else range(len(step_inputs))
        for t in order:
            gh = hidden_map(h)
            c_new = None
            if self.mode == "LSTM":
                h_new, c_new = lstm_cell(step_inputs[t], gh, c)
                if w_hr is not None:
                    h_new = projection(h_new)
            elif self.mode == "GRU":
                h_new = gru_cell(step_inputs[t], gh, h)
            else:
                h_new = rnn_cell(step_inputs[t], gh, "tanh" if self.mode == "RNN_TANH" else "relu")
            valid = masks[t] if masks is not None else None
            if valid is None:  # every sequence is still running
                outputs[t], h, c = h_new, h_new, c_new
            else:
                outputs[t] = where(valid, h_new, 0.0)
                h = where(valid, h_new, h)
                c = where(valid, c_new, c) if c_new is not None else None
        return stack(outputs), h, c

    # ------------------------------------------------------------------------------------- checks
    def _time_major_input(self, input):
        name = type(self).__name__
        layout = "(N, L, H_in)" if self.batch_first else "(L, N, H_in)"
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: expected the input as a Tensor {layout}, got {type(input).__name__}")
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            raise ValueError(
                f"{name}: expected input of shape {layout} with H_in = input_size = {self.input_size} (or (L, H_in) "
                f"unbatched), got shape {tuple(input.shape)}\n"
                f"HINT: batch_first={self.batch_first}; the last dim must be input_size")
        _check_dtype(name, input, self.weight_ih_l0)
        batched = input.ndim == 3
        x = input.unsqueeze(1) if not batched else input.transpose(0, 1) if self.batch_first else input
        if x.shape[0] == 0:
            raise ValueError(f"{name}: expected at least one time step, got input of shape {tuple(input.shape)}\n"
                             f"HINT: the time dim is {1 if batched and self.batch_first else 0} of {layout}")
        return x, batched

    def _initial_states(self, hx, x, batched, count, batch):
        name = type(self).__name__
        real_hidden = self.proj_size or self.hidden_size
        h_shape, c_shape = (count, batch, real_hidden), (count, batch, self.hidden_size)
        if hx is None:
            h0 = zeros(h_shape, dtype=x.dtype, device=x.device)
            return h0, zeros(c_shape, dtype=x.dtype, device=x.device) if self.mode == "LSTM" else None
        if self.mode == "LSTM":
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: expected hx as a tuple (h_0, c_0), got {type(hx).__name__}\n"
                                "HINT: pass both the initial hidden and cell states, or hx=None for zeros")
            h0, c0 = hx
            return self._state("h_0", h0, h_shape, batched, x), self._state("c_0", c0, c_shape, batched, x)
        if isinstance(hx, (tuple, list)):
            raise TypeError(f"{name}: expected hx as a Tensor h_0, got a {type(hx).__name__}")
        return self._state("h_0", hx, h_shape, batched, x), None

    def _state(self, what, state, shape, batched, x):
        name = type(self).__name__
        expected = shape if batched else (shape[0], shape[2])
        if not isinstance(state, Tensor) or tuple(state.shape) != expected:
            got = f"shape {tuple(state.shape)}" if isinstance(state, Tensor) else type(state).__name__
            raise ValueError(
                f"{name}: expected {what} of shape {expected}, got {got}\n"
                "HINT: initial states are (num_layers * num_directions, N, hidden) "
                "(hidden = proj_size for h_0 of a projected LSTM), without N for unbatched input, "
                "batch-major or not")
        if state.dtype != x.dtype or state.device != x.device:
            raise ValueError(f"{name}: expected {what} with the input's dtype {x.dtype} on {x.device}, got "
                             f"{state.dtype} on {state.device}\nHINT: move it with .to(input.device, input.dtype)")
        return state if batched else state.unsqueeze(1)

    def _step_masks(self, lengths, steps, batch, batched, device):
        """Per time step: None when every sequence is still running, else a (N, 1) bool Tensor of the running."""
        if lengths is None:
            return None
        name = type(self).__name__
        values = lengths.cpu().numpy() if isinstance(lengths, Tensor) else np.asarray(lengths)
        if not batched and values.ndim == 0:
            values = values.reshape(1)
        if values.shape != (batch,) or values.dtype.kind not in "iu" or (values < 0).any() or (values > steps).any():
            raise ValueError(
                f"{name}: expected lengths as {batch} integers in [0, {steps}] (one per sequence, at most the "
                f"padded length), got {values.tolist()!r}\n"
                "HINT: lengths[i] is the number of valid steps of sequence i; steps past it are padding")
        masks = []
        for t in range(steps):
            running = t < values
            masks.append(None if running.all() else Tensor(running.reshape(batch, 1), device=device))
        return masks

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu). Returns (output, h_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in _NONLINEARITY_MODE:
            raise ValueError(f"RNN: expected nonlinearity 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(_NONLINEARITY_MODE[nonlinearity], input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, device=device, dtype=dtype)


class LSTM(RNNBase):
    """Long short-term memory, gates in torch's order (i, f, g, o); with proj_size > 0, h_t = W_hr (o * tanh(c_t)).
    Returns (output, (h_n, c_n)); hx is (h_0, c_0)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)


class GRU(RNNBase):
    """Gated recurrent unit, gates in torch's order (r, z, n); n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
    Returns (output, h_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------- cells
class RNNCellBase(Module):
    """One time step: weight_ih (G hidden, input), weight_hh (G hidden, hidden), bias_ih, bias_hh as torch."""

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        _check_sizes(type(self).__name__, input_size=input_size, hidden_size=hidden_size)
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bool(bias)
        gate_size = num_chunks * hidden_size
        self.weight_ih = _param(gate_size, input_size, device=device, dtype=dtype)
        self.weight_hh = _param(gate_size, hidden_size, device=device, dtype=dtype)
        if bias:
            self.bias_ih = _param(gate_size, device=device, dtype=dtype)
            self.bias_hh = _param(gate_size, device=device, dtype=dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            init.uniform_(weight, -bound, bound)

    def _projections(self, input, hx, what="hx"):
        """(x @ W_ih^T + b_ih, h @ W_hh^T + b_hh, h, batched) with hx = zeros when None."""
        name = type(self).__name__
        if not isinstance(input, Tensor) or input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            got = f"shape {tuple(input.shape)}" if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"{name}: expected input of shape (N, {self.input_size}) or ({self.input_size},) "
                             f"unbatched, got {got}\nHINT: the last dim must be input_size; cells take one time "
                             "step (use the RNN/LSTM/GRU layers for sequences)")
        _check_dtype(name, input, self.weight_ih)
        batched = input.ndim == 2
        x = input if batched else input.unsqueeze(0)
        h = self._cell_state(hx, what, x, batched)
        return F.linear(x, self.weight_ih, self.bias_ih), F.linear(h, self.weight_hh, self.bias_hh), h, batched

    def _cell_state(self, state, what, x, batched):
        name = type(self).__name__
        if state is None:
            return zeros((x.shape[0], self.hidden_size), dtype=x.dtype, device=x.device)
        expected = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        if not isinstance(state, Tensor) or tuple(state.shape) != expected:
            got = f"shape {tuple(state.shape)}" if isinstance(state, Tensor) else type(state).__name__
            raise ValueError(f"{name}: expected {what} of shape {expected}, got {got}\n"
                             "HINT: states are (N, hidden_size), or (hidden_size,) for unbatched input")
        if state.dtype != x.dtype or state.device != x.device:
            raise ValueError(f"{name}: expected {what} with the input's dtype {x.dtype} on {x.device}, got "
                             f"{state.dtype} on {state.device}\nHINT: move it with .to(input.device, input.dtype)")
        return state if batched else state.unsqueeze(0)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        return s if self.bias else s + ", bias=False"


class RNNCell(RNNCellBase):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu)."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        if nonlinearity not in _NONLINEARITY_MODE:
            raise ValueError(f"RNNCell: expected nonlinearity 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias, 1, device=device, dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        gi, gh, _, batched = self._projections(input, hx)
        h = rnn_cell(gi, gh, self.nonlinearity)
        return h if batched else h.squeeze(0)

    def extra_repr(self):
        s = super().extra_repr()
        return s + (f", nonlinearity={self.nonlinearity}" if self.nonlinearity != "tanh" else "")


class LSTMCell(RNNCellBase):
    """(h', c') from input and hx = (h, c) (zeros when None), gates in torch's order (i, f, g, o)."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTMCell: expected hx as a tuple (h, c), got {type(hx).__name__}\n"
                            "HINT: pass both states, or hx=None for zeros")
        h0, c0 = hx if hx is not None else (None, None)
        gi, gh, _, batched = self._projections(input, h0, "h")
        c = self._cell_state(c0, "c", gi, batched)
        h, c = lstm_cell(gi, gh, c)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """h' = (h - n) z + n with r, z, n in torch's order and n = tanh(W_in x + b_in + r (W_hn h + b_hn))."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        gi, gh, h, batched = self._projections(input, hx)
        h = gru_cell(gi, gh, h)
        return h if batched else h.squeeze(0)


__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
