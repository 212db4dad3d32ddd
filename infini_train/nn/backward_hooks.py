"""Module backward hooks (``register_full_backward_hook`` / ``register_full_backward_pre_hook``), built as torch's
BackwardHook is: an identity node on the module's input tensors and one on its output tensors. The output node's
backward sees the gradients w.r.t. the outputs (grad_output: the pre-hooks run there); the input node's backward
sees the gradients w.r.t. the inputs (grad_input: the full hooks run there, and may replace them)."""
from __future__ import annotations

import warnings

from ..autograd.function import Op
from ..autograd.grad_mode import is_grad_enabled
from ..tensor import Tensor

# torch.nn.modules.module's global registries: their hooks run before every module's own
GLOBAL_BACKWARD_HOOKS = []
GLOBAL_BACKWARD_PRE_HOOKS = []


class _HookIdentity(Op):
    """Identity on some tensors; backward hands the incoming gradients (None where none came) to ``on_grads``,
    which returns the gradients to pass on."""

    def __init__(self, on_grads):
        self.on_grads = on_grads

    def forward(self, *arrays):
        return arrays

    def _take_grads(self, create_graph=False):
        grads = self.grad_outputs  # as Function._take_grads, but no zeros for outputs that got no gradient
        self.grad_outputs = None
        if grads is None or self.grad_outputs_reached == 0:
            return None
        if self._pre_hooks:
            grads = self._run_tensor_hooks(grads, create_graph)
        return grads

    def backward(self, *grads):
        dev = self.device
        hooked = self.on_grads(tuple(None if g is None else Tensor._make(g, dev) for g in grads))
        return tuple(None if g is None else (g.array if isinstance(g, Tensor) else g) for g in hooked)

    def _graph_backward(self, grads):  # create_graph: the gradients stay Tensors
        return tuple(self.on_grads(tuple(grads)))


def _pack(indices, values, size):
    packed = [None] * size
    for i, v in zip(indices, values):
        packed[i] = v
    return tuple(packed)


class BackwardHook:
    """One forward call's backward hooks: ``setup_inputs(args)`` before forward, ``setup_outputs(result)`` after."""

    def __init__(self, module, full_hooks, pre_hooks):
        self.module = module
        self.full_hooks = full_hooks
        self.pre_hooks = pre_hooks
        self.grad_outputs = None
        self.n_inputs = 0
        self.input_index = None  # positions of the tensor inputs (None: no input requires grad)
        self.input_zeros = ()  # (position, shape, dtype, device) of tensor inputs needing no grad: their grad_input
        self.n_outputs = 0
        self.output_index = None

    @staticmethod
    def _wrap(values, on_grads):
        """(values with the tensors among them passed through a _HookIdentity, their positions) or (values, None)
        when no tensor there requires grad."""
        index = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
        if not is_grad_enabled() or not any(values[i].requires_grad for i in index):
            return values, None
        # only the tensors that require grad pass through the node; the rest stay as they are (torch marks them
        # non-differentiable), so their grad_input is None
        through = [i for i in index if values[i].requires_grad]
        outs = _HookIdentity(lambda grads: on_grads(through, grads)).apply(*(values[i] for i in through))
        wrapped = list(values)
        for i, t in zip(through, outs):
            t._version = values[i]._version  # the same memory: an in-place change shows on both, as on a view
            wrapped[i] = t
        return tuple(wrapped), index

    def setup_inputs(self, args):
        self.n_inputs = len(args)
        wrapped, self.input_index = self._wrap(args, self._input_grads)
        if self.input_index is not None:
            self.input_zeros = tuple((i, args[i].shape, args[i].dtype, args[i].device) for i in self.input_index
                                     if not args[i].requires_grad)
        return wrapped

    def setup_outputs(self, result):
        single = not isinstance(result, tuple)
        if single and not isinstance(result, Tensor):
            warnings.warn(f"{type(self.module).__name__}: for backward hooks to be called, the module's output "
                          f"should be a Tensor or a tuple of Tensors, got {type(result).__name__}", stacklevel=3)
        values = (result,) if single else result
        self.n_outputs = len(values)
        values, self.output_index = self._wrap(values, self._output_grads)
        return values[0] if single else values

    def _output_grads(self, through, grads):
        self.grad_outputs = _pack(through, grads, self.n_outputs)
        for hook in self.pre_hooks:
            replaced = hook(self.module, self.grad_outputs)
            if replaced is None:
                continue
            replaced = _as_tuple(replaced)
            if len(replaced) != len(self.grad_outputs):
                raise RuntimeError(f"Backward pre hook returned an invalid number of grad_output, got "
                                   f"{len(replaced)}, but expected {len(self.grad_outputs)}\nHINT: return one "
                                   f"gradient (or None) per module output, or None to keep them")
            self.grad_outputs = replaced
        grad_outputs = self.grad_outputs
        if self.input_index is None:  # no input requires grad: the full hooks run here, with grad_input all None
            grad_inputs = (None,) * self.n_inputs
            warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs "
                          "since no inputs require gradients", stacklevel=2)
            for hook in self.full_hooks:
                res = hook(self.module, grad_inputs, grad_outputs)
                if res is not None and not (isinstance(res, tuple) and all(g is None for g in res)):
                    raise RuntimeError("Backward hook for Modules where no input requires gradient should always "
                                       "return None or None for all gradients.")
            self.grad_outputs = None
        return tuple(grad_outputs[i] for i in through)

    def _input_grads(self, through, grads):
        if self.grad_outputs is None:  # the gradient reached the inputs without passing through the outputs
            return grads
        grad_inputs = list(_pack(through, grads, self.n_inputs))
        for i, shape, dtype, device in self.input_zeros:  # as torch: zeros for a tensor input that needs no grad
            grad_inputs[i] = Tensor._make(device.array_module().zeros(shape, dtype), device)
        grad_inputs = tuple(grad_inputs)
        for hook in self.full_hooks:
            replaced = hook(self.module, grad_inputs, self.grad_outputs)
            if replaced is None:
                continue
            replaced = _as_tuple(replaced)
            if len(replaced) != len(grad_inputs):
                raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got {len(replaced)}, "
                                   f"but expected {len(grad_inputs)}\nHINT: return one gradient (or None) per "
                                   f"positional input of forward, or None to keep them")
            grad_inputs = replaced
        self.grad_outputs = None
        return tuple(grad_inputs[i] for i in through)


def _as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)
