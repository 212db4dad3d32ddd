"""Fused recurrent cells: one node per time step for the whole cell, forward and backward side by side.

A recurrent layer computes ``gi = x @ W_ih^T + b_ih`` for every time step in one GEMM, splits it into steps with
``unbind_steps`` (one node, so backward stacks the step gradients once), and per step computes
``gh = h @ W_hh^T + b_hh`` (one GEMM) and one of the cell ops below on ``(gi_t, gh_t, state)``:

- ``rnn_cell``:  h' = act(gi + gh), act = tanh or relu
- ``lstm_cell``: gates = gi + gh in torch's order (i, f, g, o); c' = f c + i g; h' = o tanh(c')
- ``gru_cell``:  r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n);
  h' = (h - n) z + n (torch's formulation; gh_n includes b_hn, so the reset gate scales W_hn h + b_hn)

Each backward computes every gate's gradient in one pass over (batch, hidden) arrays. The gradients of gi and gh
are equal (they are summed in forward), except for GRU's n gate where gh_n's is scaled by r. float16/bfloat16
inputs are computed on in float32 and the results rounded once to the widest input dtype.
"""
from __future__ import annotations

from .activations import sigmoid_array
from ..function import Op, op_error
from .low_precision import narrow, widen
from .softmax import upcast

_NONLINEARITIES = ("tanh", "relu")


def _result_dtype(*arrays):
    """The widest floating dtype among the inputs (float32 state with bfloat16 gates under autocast: float32)."""
    return max((a.dtype for a in arrays), key=lambda d: d.itemsize)


def _check_gates(op, gi, gh, hidden, chunks):
    width = chunks * hidden
    if gi.shape[-1:] != (width,) or gh.shape != gi.shape:
        raise op_error(op, f"gi and gh of one shape (batch, {chunks} * hidden = {width}) for a state of size {hidden}",
                       f"gi {gi.shape}, gh {gh.shape}",
                       "gi = x @ W_ih^T + b_ih and gh = h @ W_hh^T + b_hh, with W_* of shape "
                       f"({chunks} * hidden_size, *)")


class UnbindSteps(Op):
    """x of shape (T, ...) -> (x[0], ..., x[T-1]). One node for all steps: backward stacks the step gradients
    once (zeros for steps that got none) instead of scattering each into a full-size array of zeros."""

    def forward(self, x):
        if x.ndim == 0 or x.shape[0] == 0:
            raise op_error("unbind_steps", "a tensor with a non-empty leading (time) dim", f"shape {x.shape}")
        return tuple(x[t] for t in range(x.shape[0]))

    def backward(self, *grads):
        return self.xp.stack(grads)


class SharedStepWeights:
    """The weight (and bias) of a linear map applied at every time step of one recurrence (W_hh, or W_hr of a
    projected LSTM); calling it on a step's input gives that step's x @ W^T + b.

    The weight gradient of all steps is one GEMM instead of one small GEMM and one accumulation per step: the
    first step (in processing order) takes W and b as tensors, later steps take their arrays and leave their
    output gradient and input here. The first step's backward runs after every later step's (their gradients
    reach it through the recurrent state), so it finds them all and computes dW = G^T X and db = sum(G) over the
    stacked gradients G and inputs X. Later steps read W's array as it was: modifying W in place between forward
    and backward is caught through the first step's saved tensor."""

    __slots__ = ("weight", "bias", "pending", "need_weight", "need_bias", "started")

    def __init__(self, weight, bias=None):
        self.weight, self.bias = weight, bias
        self.pending = []  # (output gradient, input) of later steps, awaiting the first step's backward
        self.need_weight = self.need_bias = False
        self.started = False

    def __call__(self, x):
        if not self.started:
            self.started = True
            return StepLinear(self, True).apply(x, self.weight, self.bias)
        bias = self.bias.array if self.bias is not None else None
        return StepLinear(self, False).apply(x, self.weight.array, bias)


class StepLinear(Op):
    """One step of a SharedStepWeights map: x @ W^T + b."""

    def __init__(self, shared, first):
        self.shared, self.first = shared, first

    def forward(self, x, weight, bias):
        if x.shape[-1:] != weight.shape[1:]:
            raise op_error("step_linear", f"x of shape (..., {weight.shape[1]}) for weight {weight.shape}",
                           f"x of shape {x.shape}")
        xp = self.xp
        dtype = _result_dtype(x, weight)
        x, weight, bias = widen(xp, x, weight, bias)
        out = xp.matmul(x, weight.T)
        if bias is not None:
            out += bias
        if not self.first:
            self.weight = weight
        return narrow(xp, out, dtype)

    def setup_context(self, inputs, output):
        shared = self.shared
        x = inputs[0]
        if self.first:
            shared.need_weight, shared.need_bias = self.needs_input_grad[1], self.needs_input_grad[2]
            self.save_for_backward(x, inputs[1])
        elif shared.need_weight or shared.need_bias:
            self.stash(x.array)

    def backward(self, g):
        xp = self.xp
        shared = self.shared
        g = upcast(g)
        if not self.first:
            if shared.need_weight or shared.need_bias:
                shared.pending.append((g, self.stashed[0]))
            return (xp.matmul(g, self.weight) if self.needs_input_grad[0] else None), None, None
        x, weight = widen(xp, *self.saved_arrays)
        pending, shared.pending = shared.pending, []
        grads = xp.concatenate([g.reshape(-1, g.shape[-1])] + [p.reshape(-1, p.shape[-1]) for p, _ in pending])
        grad_w = grad_b = None
        if shared.need_weight:
            inputs = xp.concatenate([upcast(a).reshape(-1, a.shape[-1]) for a in [x] + [q for _, q in pending]])
            grad_w = xp.matmul(grads.T, inputs)
        if shared.need_bias:
            grad_b = grads.sum(axis=0)
        return (xp.matmul(g, weight) if self.needs_input_grad[0] else None), grad_w, grad_b


class RNNCell(Op):
    """h' = tanh(gi + gh) or relu(gi + gh)."""

    def __init__(self, nonlinearity="tanh"):
        if nonlinearity not in _NONLINEARITIES:
            raise op_error("rnn_cell", f"nonlinearity in {_NONLINEARITIES}", repr(nonlinearity))
        self.nonlinearity = nonlinearity

    def forward(self, gi, gh):
        _check_gates("rnn_cell", gi, gh, gi.shape[-1], 1)
        xp = self.xp
        dtype = _result_dtype(gi, gh)
        h = xp.add(upcast(gi), upcast(gh))
        if self.nonlinearity == "tanh":
            xp.tanh(h, out=h)
        else:
            xp.maximum(h, 0, out=h)
        return narrow(xp, h, dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(output)

    def backward(self, g):
        (h,) = self.saved_arrays
        h, g = upcast(h), upcast(g)
        if self.nonlinearity == "tanh":
            d = h * h
            self.xp.subtract(1, d, out=d)
            d *= g
        else:
            d = g * (h > 0)
        return d, d


class LSTMCell(Op):
    """(gi, gh, c) -> (h', c') with gates = gi + gh of shape (batch, 4 hidden) in the order i, f, g, o."""

    def forward(self, gi, gh, c_prev):
        xp = self.xp
        hidden = c_prev.shape[-1]
        _check_gates("lstm_cell", gi, gh, hidden, 4)
        dtype = _result_dtype(gi, gh, c_prev)
        gates = xp.add(upcast(gi), upcast(gh))
        c_prev = upcast(c_prev)
        in_forget = sigmoid_array(xp, gates[..., :2 * hidden])
        cand = xp.tanh(gates[..., 2 * hidden:3 * hidden])
        out_gate = sigmoid_array(xp, gates[..., 3 * hidden:])
        c = in_forget[..., hidden:] * c_prev
        c += in_forget[..., :hidden] * cand
        tanh_c = xp.tanh(c)
        h = out_gate * tanh_c
        self.stash(in_forget, cand, out_gate, tanh_c)
        return narrow(xp, h, dtype), narrow(xp, c, dtype)

    def setup_context(self, inputs, outputs):
        self.save_for_backward(inputs[2])

    def backward(self, g_h, g_c):
        xp = self.xp
        (c_prev,) = self.saved_arrays
        in_forget, cand, out_gate, tanh_c = self.stashed
        c_prev, g_h, g_c = upcast(c_prev), upcast(g_h), upcast(g_c)
        hidden = c_prev.shape[-1]
        i, f = in_forget[..., :hidden], in_forget[..., hidden:]
        # dL/dc' = g_c + g_h o (1 - tanh(c')^2)
        dc = tanh_c * tanh_c
        xp.subtract(1, dc, out=dc)
        dc *= out_gate
        dc *= g_h
        dc += g_c
        d_gates = xp.empty(c_prev.shape[:-1] + (4 * hidden,), dc.dtype)
        d_i, d_f = d_gates[..., :hidden], d_gates[..., hidden:2 * hidden]
        d_g, d_o = d_gates[..., 2 * hidden:3 * hidden], d_gates[..., 3 * hidden:]
        sig_slope = xp.subtract(1, in_forget)  # sigmoid' = s (1 - s), for i and f at once
        sig_slope *= in_forget
        xp.multiply(dc, cand, out=d_i)
        d_i *= sig_slope[..., :hidden]
        xp.multiply(dc, c_prev, out=d_f)
        d_f *= sig_slope[..., hidden:]
        xp.multiply(cand, cand, out=d_g)
        xp.subtract(1, d_g, out=d_g)
        d_g *= i
        d_g *= dc
        xp.subtract(1, out_gate, out=d_o)
        d_o *= out_gate
        d_o *= tanh_c
        d_o *= g_h
        dc *= f
        return d_gates, d_gates, dc


class GRUCell(Op):
    """(gi, gh, h) -> h' with gi, gh of shape (batch, 3 hidden) in the order r, z, n."""

    def forward(self, gi, gh, h_prev):
        xp = self.xp
        hidden = h_prev.shape[-1]
        _check_gates("gru_cell", gi, gh, hidden, 3)
        dtype = _result_dtype(gi, gh, h_prev)
        gi, gh, h_prev = upcast(gi), upcast(gh), upcast(h_prev)
        reset_update = xp.add(gi[..., :2 * hidden], gh[..., :2 * hidden])
        reset_update = sigmoid_array(xp, reset_update)
        r, z = reset_update[..., :hidden], reset_update[..., hidden:]
        hn = gh[..., 2 * hidden:]
        n = r * hn
        n += gi[..., 2 * hidden:]
        xp.tanh(n, out=n)
        h = xp.subtract(h_prev, n)
        h *= z
        h += n
        self.stash(reset_update, n, hn)
        return narrow(xp, h, dtype)

    def setup_context(self, inputs, output):
        self.save_for_backward(inputs[2])

    def backward(self, g):
        xp = self.xp
        (h_prev,) = self.saved_arrays
        reset_update, n, hn = self.stashed
        h_prev, g = upcast(h_prev), upcast(g)
        hidden = h_prev.shape[-1]
        r, z = reset_update[..., :hidden], reset_update[..., hidden:]
        d_gi = xp.empty(h_prev.shape[:-1] + (3 * hidden,), g.dtype)
        d_r, d_z, d_n = d_gi[..., :hidden], d_gi[..., hidden:2 * hidden], d_gi[..., 2 * hidden:]
        sig_slope = xp.subtract(1, reset_update)
        sig_slope *= reset_update
        # n pre-activation: g (1 - z) (1 - n^2)
        xp.multiply(n, n, out=d_n)
        xp.subtract(1, d_n, out=d_n)
        d_n *= g
        d_n *= 1 - z
        # z pre-activation: g (h - n) z (1 - z)
        xp.subtract(h_prev, n, out=d_z)
        d_z *= g
        d_z *= sig_slope[..., hidden:]
        # r pre-activation: d_n gh_n r (1 - r)
        xp.multiply(d_n, hn, out=d_r)
        d_r *= sig_slope[..., :hidden]
        d_gh = d_gi.copy()
        d_gh[..., 2 * hidden:] *= r
        return d_gi, d_gh, g * z


def unbind_steps(x):
    """The time steps of ``x`` (T, ...) as a tuple of T tensors, through one autograd node."""
    return UnbindSteps().apply(x)


def rnn_cell(gi, gh, nonlinearity="tanh"):
    """Elman cell on precomputed projections: tanh(gi + gh) or relu(gi + gh)."""
    return RNNCell(nonlinearity).apply(gi, gh)


def lstm_cell(gi, gh, c):
    """LSTM cell on precomputed gate projections gi, gh (batch, 4 hidden; order i, f, g, o): returns (h', c')."""
    return LSTMCell().apply(gi, gh, c)


def gru_cell(gi, gh, h):
    """GRU cell on precomputed projections gi, gh (batch, 3 hidden; order r, z, n, each with its bias): h'."""
    return GRUCell().apply(gi, gh, h)


__all__ = ["SharedStepWeights", "unbind_steps", "rnn_cell", "lstm_cell", "gru_cell"]
