"""Tensor: an xp array + device + requires_grad + grad + grad_fn. Operators call autograd Functions."""
from __future__ import annotations

import numbers

import numpy as np

from . import backend
from .autograd import engine
from .autograd.function import RemovableHandle
from .autograd.grad_mode import _state


class Tensor:
    __slots__ = ("array", "device", "_requires_grad", "grad", "grad_fn", "_output_idx", "_version",
                 "_accumulate", "__weakref__")
    __array_priority__ = 1000
    __array_ufunc__ = None  # numpy defers to our reflected operators: np.float32(2) * t -> t.__rmul__

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        from .creation import as_array
        dev = backend.Device.parse(device) if device is not None else (
            data.device if isinstance(data, Tensor) else backend.device_of_array(data))
        self.array = as_array(data, dtype, dev, copy=True)
        self.device = dev
        self._requires_grad = False
        self.grad = None
        self.grad_fn = None
        self._output_idx = 0
        self._version = [0]
        self._accumulate = None
        if requires_grad:
            self.requires_grad = True

    @classmethod
    def _make(cls, array, device, requires_grad=False):
        """Wrap an array without copying or checking (the fast path used by every op)."""
        t = object.__new__(cls)
        t._init_slots(array, device, requires_grad)
        return t

    def _init_slots(self, array, device, requires_grad=False, version=None):
        self.array = array
        self.device = device
        self._requires_grad = requires_grad
        self.grad = None
        self.grad_fn = None
        self._output_idx = 0
        self._version = [0] if version is None else version
        self._accumulate = None

    # ------------------------------------------------------------------------------- properties
    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def ndim(self):
        return self.array.ndim

    def dim(self):
        return self.array.ndim

    def numel(self):
        return int(self.array.size)

    def size(self, dim=None):
        return self.array.shape if dim is None else self.array.shape[dim]

    def element_size(self):
        return self.array.dtype.itemsize

    @property
    def nbytes(self):
        return int(self.array.nbytes)

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        flag = bool(flag)
        if self.grad_fn is not None:
            if not flag:
                raise RuntimeError(
                    "requires_grad: you can only change requires_grad of leaf tensors.\n"
                    "HINT: use .detach() to get a tensor that does not require grad")
            return
        if flag and not backend.is_floating(self.array.dtype):
            raise RuntimeError(
                f"requires_grad: only tensors of floating dtype can require gradients, got {self.dtype}")
        self._requires_grad = flag

    def requires_grad_(self, flag=True):
        self.requires_grad = flag
        return self

    @property
    def data(self):
        """A detached tensor sharing this tensor's memory."""
        return self.detach()

    @data.setter
    def data(self, other):
        self.array = other.array if isinstance(other, Tensor) else other
        self._version[0] += 1

    @property
    def version(self):
        return self._version[0]

    # -------------------------------------------------------------------------------- autograd
    def backward(self, gradient=None, retain_graph=False):
        engine.backward((self,), None if gradient is None else (gradient,), retain_graph=retain_graph)

    def _accumulate_node(self):
        node = self._accumulate
        if node is None:
            from .autograd.accumulate import AccumulateGrad
            node = self._accumulate = AccumulateGrad(self)
        return node

    def register_hook(self, hook):
        """``hook(grad) -> None | new grad`` runs when this tensor's gradient is computed."""
        if not self._requires_grad:
            raise RuntimeError("register_hook: cannot register a hook on a tensor that does not require grad")
        if self.grad_fn is not None:
            node, idx = self.grad_fn, self._output_idx
        else:
            node, idx = self._accumulate_node(), 0
        node._add_pre_hook(idx, hook)
        return RemovableHandle(node._pre_hooks[idx], hook)

    def register_post_accumulate_grad_hook(self, hook):
        """``hook(tensor)`` runs after a leaf's ``.grad`` was updated by backward."""
        if self.grad_fn is not None or not self._requires_grad:
            raise RuntimeError("register_post_accumulate_grad_hook: only leaf tensors that require grad have "
                               "an AccumulateGrad node")
        return self._accumulate_node().register_post_accumulate_hook(hook)

    def retain_grad(self):
        """Keep ``.grad`` on a non-leaf tensor (leaves keep theirs anyway)."""
        if self.grad_fn is None:
            return

        def keep(grad):
            self.grad = grad if self.grad is None else Tensor._make(self.grad.array + grad.array, self.device)

        self.register_hook(keep)

    def detach(self):
        t = Tensor._make(self.array, self.device)
        t._version = self._version
        return t

    def detach_(self):
        self.grad_fn = None
        self._requires_grad = False
        return self

    # ------------------------------------------------------------------------------ conversion
    def numpy(self):
        """The values as a numpy array (shares memory on CPU devices; copies from a GPU)."""
        return backend.to_device_array(self.array, backend.CPU)

    def item(self):
        if self.array.size != 1:
            raise ValueError(f"item: expected a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def to(self, *args, dtype=None, device=None):
        for a in args:
            if isinstance(a, (str, backend.Device)) and (not isinstance(a, str) or a.split(":")[0] in ("cpu", "cuda")):
                device = a
            else:
                dtype = a
        out = self
        if dtype is not None and backend.as_dtype(dtype) != self.dtype:
            out = conversion.cast(out, backend.as_dtype(dtype))
        if device is not None and backend.Device.parse(device) is not self.device:
            out = conversion.to_device(out, backend.Device.parse(device))
        return out

    def cpu(self):
        return self.to(device=backend.CPU)

    def cuda(self, index=0):
        return self.to(device=f"cuda:{index}")

    def float(self):
        return self.to(backend.float32)

    def double(self):
        return self.to(backend.float64)

    def half(self):
        return self.to(backend.float16)

    def long(self):
        return self.to(backend.int64)

    def int(self):
        return self.to(backend.int32)

    def bool(self):
        return self.to(backend.bool_)

    def clone(self):
        return conversion.clone(self)

    def contiguous(self):
        return transform.contiguous(self)

    # -------------------------------------------------------------------------------- in-place
    def _inplace(self, op):
        if _state.enabled and self._requires_grad:
            kind = "a leaf tensor" if self.grad_fn is None else "a tensor"
            raise RuntimeError(
                f"{op}: {kind} that requires grad is being modified in place while grad mode is on.\n"
                "HINT: wrap the update in `with infini_train.no_grad():` (as optimizers do), or use the "
                "out-of-place op")
        self._version[0] += 1
        return self.device.xp if self.device.xp is not None else self.device.array_module()

    def _other_array(self, other):
        return other.array if isinstance(other, Tensor) else other

    def zero_(self):
        self._inplace("zero_")
        self.array.fill(0)
        return self

    def fill_(self, value):
        self._inplace("fill_")
        self.array.fill(value)
        return self

    def add_(self, other, alpha=1):
        xp = self._inplace("add_")
        o = self._other_array(other)
        xp.add(self.array, o if alpha == 1 else o * alpha, out=self.array, casting="unsafe")
        return self

    def sub_(self, other, alpha=1):
        xp = self._inplace("sub_")
        o = self._other_array(other)
        xp.subtract(self.array, o if alpha == 1 else o * alpha, out=self.array, casting="unsafe")
        return self

    def mul_(self, other):
        xp = self._inplace("mul_")
        xp.multiply(self.array, self._other_array(other), out=self.array, casting="unsafe")
        return self

    def div_(self, other):
        xp = self._inplace("div_")
        xp.divide(self.array, self._other_array(other), out=self.array, casting="unsafe")
        return self

    def clamp_(self, min=None, max=None):
        xp = self._inplace("clamp_")
        xp.clip(self.array, min, max, out=self.array)
        return self

    def copy_(self, src):
        xp = self._inplace("copy_")
        arr = src.array if isinstance(src, Tensor) else src
        if isinstance(src, Tensor) and src.device is not self.device:
            arr = backend.to_device_array(arr, self.device)
        try:
            xp.copyto(self.array, arr, casting="unsafe")
        except ValueError as exc:
            raise ValueError(f"copy_: source of shape {tuple(getattr(arr, 'shape', ()))} does not broadcast to "
                             f"the destination's shape {self.shape}") from exc
        return self

    def uniform_(self, low=0.0, high=1.0):
        xp = self._inplace("uniform_")
        gen = backend.generator_for(self.device)
        xp.copyto(self.array, gen.uniform(low, high, self.shape), casting="unsafe")
        return self

    def normal_(self, mean=0.0, std=1.0):
        xp = self._inplace("normal_")
        gen = backend.generator_for(self.device)
        xp.copyto(self.array, gen.standard_normal(self.shape) * std + mean, casting="unsafe")
        return self

    def __setitem__(self, index, value):
        self._inplace("__setitem__")
        if isinstance(index, Tensor):
            index = index.array
        elif isinstance(index, tuple):
            index = tuple(i.array if isinstance(i, Tensor) else i for i in index)
        value = value.array if isinstance(value, Tensor) else value
        self.array[index] = value

    # ------------------------------------------------------------------------------- operators
    def __add__(self, other):
        return elementwise.add(self, other)

    def __radd__(self, other):
        return elementwise.add(other, self)

    def __sub__(self, other):
        return elementwise.sub(self, other)

    def __rsub__(self, other):
        return elementwise.sub(other, self)

    def __mul__(self, other):
        return elementwise.mul(self, other)

    def __rmul__(self, other):
        return elementwise.mul(other, self)

    def __truediv__(self, other):
        return elementwise.div(self, other)

    def __rtruediv__(self, other):
        return elementwise.div(other, self)

    def __neg__(self):
        return elementwise.neg(self)

    def __pow__(self, exponent):
        return elementwise.pow(self, exponent)

    def __rpow__(self, base):
        return elementwise.pow(base, self)

    def __matmul__(self, other):
        return matmul.matmul(self, other)

    def __rmatmul__(self, other):
        return matmul.matmul(other, self)

    def __eq__(self, other):
        return elementwise.eq(self, other)

    def __ne__(self, other):
        return elementwise.ne(self, other)

    def __lt__(self, other):
        return elementwise.lt(self, other)

    def __le__(self, other):
        return elementwise.le(self, other)

    def __gt__(self, other):
        return elementwise.gt(self, other)

    def __ge__(self, other):
        return elementwise.ge(self, other)

    def __and__(self, other):
        return elementwise.logical_and(self, other)

    def __or__(self, other):
        return elementwise.logical_or(self, other)

    def __invert__(self):
        return elementwise.logical_not(self)

    __hash__ = object.__hash__

    def __getitem__(self, index):
        return misc.getitem(self, index)

    def __len__(self):
        if self.array.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.array.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self):
        if self.array.size != 1:
            raise RuntimeError(f"bool: a tensor with {self.array.size} elements has an ambiguous truth value")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.array.dtype.kind not in "iu" or self.array.size != 1:
            raise TypeError("only integer tensors of one element can be used as an index")
        return int(self.item())

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self):
        body = np.array2string(self.numpy(), separator=", ", precision=4, threshold=200, prefix="tensor(")
        extras = []
        if self.device is not backend.CPU:
            extras.append(f"device='{self.device}'")
        if self.dtype not in (backend.float32, backend.int64, backend.bool_):
            extras.append(f"dtype={self.dtype}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name}>")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body] + extras) + ")"

    # ------------------------------------------------------------------------------ math methods
    def exp(self):
        return elementwise.exp(self)

    def log(self):
        return elementwise.log(self)

    def sqrt(self):
        return elementwise.sqrt(self)

    def rsqrt(self):
        return elementwise.rsqrt(self)

    def tanh(self):
        return elementwise.tanh(self)

    def sin(self):
        return elementwise.sin(self)

    def cos(self):
        return elementwise.cos(self)

    def abs(self):
        return elementwise.abs(self)

    def pow(self, exponent):
        return elementwise.pow(self, exponent)

    def reciprocal(self):
        return elementwise.reciprocal(self)

    def clamp(self, min=None, max=None):
        return elementwise.clamp(self, min, max)

    clip = clamp

    def maximum(self, other):
        return elementwise.maximum(self, other)

    def minimum(self, other):
        return elementwise.minimum(self, other)

    def sigmoid(self):
        return activations.sigmoid(self)

    def relu(self):
        return activations.relu(self)

    def softmax(self, dim=-1):
        return softmax.softmax(self, dim)

    def log_softmax(self, dim=-1):
        return softmax.log_softmax(self, dim)

    # ---------------------------------------------------------------------------- reductions
    def sum(self, dim=None, keepdim=False):
        return reduction.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return reduction.mean(self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return reduction.max(self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        return reduction.min(self, dim, keepdim)

    def var(self, dim=None, keepdim=False, correction=1):
        return reduction.var(self, dim, keepdim, correction)

    def std(self, dim=None, keepdim=False, correction=1):
        return reduction.std(self, dim, keepdim, correction)

    def argmax(self, dim=None, keepdim=False):
        return reduction.argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim=False):
        return reduction.argmin(self, dim, keepdim)

    # ---------------------------------------------------------------------------- shape methods
    def reshape(self, *shape):
        return transform.reshape(self, _shape_arg(shape))

    def view(self, *shape):
        return transform.reshape(self, _shape_arg(shape))

    def transpose(self, dim0, dim1):
        return transform.transpose(self, dim0, dim1)

    def permute(self, *dims):
        return transform.permute(self, _shape_arg(dims))

    def t(self):
        if self.ndim > 2:
            raise ValueError(f"t: expects a tensor with <= 2 dims, got {self.ndim}.\nHINT: use .transpose(d0, d1)")
        return self if self.ndim < 2 else transform.transpose(self, 0, 1)

    @property
    def T(self):
        return transform.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    def unsqueeze(self, dim):
        return transform.unsqueeze(self, dim)

    def squeeze(self, dim=None):
        return transform.squeeze(self, dim)

    def expand(self, *shape):
        return transform.expand(self, _shape_arg(shape))

    def flatten(self, start_dim=0, end_dim=-1):
        return transform.flatten(self, start_dim, end_dim)

    def repeat_interleave(self, repeats, dim=None):
        return transform.repeat_interleave(self, repeats, dim)

    def masked_fill(self, mask, value):
        return transform.masked_fill(self, mask, value)

    def tril(self, diagonal=0):
        return transform.tril(self, diagonal)

    def triu(self, diagonal=0):
        return transform.triu(self, diagonal)

    def split(self, split_size_or_sections, dim=0):
        return misc.split(self, split_size_or_sections, dim)

    def chunk(self, chunks, dim=0):
        return misc.chunk(self, chunks, dim)

    def gather(self, dim, index):
        return misc.gather(self, dim, index)


def _shape_arg(shape):
    """Accept f(2, 3) and f((2, 3)) alike."""
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


# Bound after the class exists: the op families import Tensor from this module.
from .autograd import (  # noqa: E402
    activations,
    conversion,
    elementwise,
    matmul,
    misc,
    reduction,
    softmax,
    transform,
)
