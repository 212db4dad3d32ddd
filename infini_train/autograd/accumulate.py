"""AccumulateGrad: the leaf node where gradients end, and the hooks that run after accumulation.

A leaf tensor that requires grad owns one AccumulateGrad (created on first use and kept, so hooks
registered on it persist across iterations). Its backward adds the incoming gradient, scaled by
``learning_rate``, into ``tensor.grad`` and then runs the post-accumulate hooks in registration order;
DDP registers its bucketed reduction there (a plain all-reduce hook is infini_train.distributed's
AllReducePostAccumulateHook).
"""
from __future__ import annotations

from .engine import pass_state
from .function import Function
from .hooks import RemovableHandle


class PostAccumulateGradHook:
    """Called with the leaf tensor after its ``.grad`` was updated. Subclass and implement ``__call__``."""

    def __call__(self, tensor):
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(tensor)")


class AccumulateGrad(Function):
    _arrays = True

    def __init__(self, tensor, learning_rate=1.0):
        self.tensor = tensor
        self.learning_rate = float(learning_rate)
        self.device = tensor.device
        self.xp = tensor.device.array_module()
        self._post_hooks = []

    def register_post_accumulate_hook(self, hook):
        """``hook(tensor)`` runs after every accumulation into ``tensor.grad``."""
        self._post_hooks.append(hook)
        return RemovableHandle(self._post_hooks, hook)

    def forward(self, *inputs):
        return self.tensor.array

    def backward(self, grad):
        from ..tensor import Tensor

        t = self.tensor
        if not isinstance(grad, self.xp.ndarray):
            grad = self.xp.asarray(grad)  # a numpy scalar from 0-d arithmetic: in-place adds need an array
        if grad.shape != t.array.shape:
            raise RuntimeError(f"AccumulateGrad: gradient of shape {tuple(grad.shape)} for a leaf of shape {t.shape}")
        handed = pass_state.handed
        if self.learning_rate != 1.0:
            grad = grad * self.learning_rate
        elif grad.base is not None or (handed is not None and id(grad) in handed):
            grad = grad.copy()  # a view, or an array another leaf already owns: never alias two .grads
        if grad.dtype != t.array.dtype:
            grad = grad.astype(t.array.dtype)
        if t.grad is None:
            t.grad = Tensor._make(grad, t.device)
            if handed is not None:
                handed.add(id(grad))
        else:
            self.xp.add(t.grad.array, grad, out=t.grad.array)
            t.grad._version[0] += 1
        return None

    def _run_backward(self, retain_graph, create_graph=False):
        grads = self.grad_outputs
        self.grad_outputs = None
        if grads is None or grads[0] is None:
            return ()
        if self._pre_hooks:
            grads = self._run_tensor_hooks(grads, create_graph)
        if create_graph:
            self._accumulate_graph(grads[0])
        else:
            self.backward(grads[0])
        for hook in self._post_hooks:
            hook(self.tensor)
        return ()

    def _accumulate_graph(self, grad):
        """create_graph=True: ``.grad`` keeps the gradient's history, accumulated out of place (as torch)."""
        t = self.tensor
        if self.learning_rate != 1.0:
            grad = grad * self.learning_rate
        if grad.dtype != t.dtype:
            grad = grad.to(t.dtype)
        t.grad = grad if t.grad is None else t.grad + grad

    def __repr__(self):
        return f"<AccumulateGrad shape={self.tensor.shape}>"
