"""Tensor: an xp array + device + requires_grad + grad + grad_fn. Operators call autograd Functions."""
from __future__ import annotations

import numbers

import numpy as np

from . import backend
from .autograd import engine
from .generator import draw_source
from .autograd.hooks import RemovableHandle
from .autograd.grad_mode import _state
from .lazy_mode.mode import ACTIVE as _LAZY
from .memory_format import check_contiguous_format, contiguous_format
from .tensor_methods import TensorMethods
from .placement import REPLICATED


class Tensor(TensorMethods):
    __slots__ = ("array", "device", "_requires_grad", "grad", "grad_fn", "_output_idx", "_version",
                 "_accumulate", "_view", "_lazy", "__weakref__")  # _lazy: set only on lazy mode's placeholders
    __array_priority__ = 1000
    placement = REPLICATED  # where its values live across ranks (placement.py); a Parameter may hold another
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
        self._view = None
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
        self._view = None  # a ViewInfo when this tensor is a differentiable view of another (see views.py)

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
        if _LAZY:  # lazy tensors reading the old array compute first (lazy_mode/graph.py)
            from .lazy_mode.graph import before_write
            before_write(self)
        self.array = other.array if isinstance(other, Tensor) else other
        self._version[0] += 1

    @property
    def version(self):
        return self._version[0]

    # -------------------------------------------------------------------------------- autograd
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate the gradient of this tensor into the leaves' ``.grad`` (only those in ``inputs`` when
        given). ``create_graph=True`` records the backward itself, for higher-order gradients."""
        engine.backward((self,), None if gradient is None else (gradient,), retain_graph=retain_graph,
                        create_graph=create_graph, inputs=inputs)

    def _accumulate_node(self):
        node = self._accumulate
        if node is None:
            from .autograd.accumulate import AccumulateGrad
            node = self._accumulate = AccumulateGrad(self)
        return node

    def register_hook(self, hook):
        """``hook(grad) -> None | new grad`` runs when this tensor's gradient is computed."""
        if self._view is not None and self._view.version != self._version[0] and _state.enabled:
            from .autograd.views import refresh_view
            refresh_view(self)
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

    def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False):
        """A tensor with the given dtype and/or device (``t.to(other)`` takes other's): itself when nothing
        changes (unless copy=True), else a differentiable cast/move."""
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, backend.Device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
                device = a
            else:
                dtype = a
        out = self
        if dtype is not None and backend.as_dtype(dtype) != self.dtype:
            out = conversion.cast(out, backend.as_dtype(dtype))
        if device is not None and backend.Device.parse(device) is not self.device:
            out = conversion.to_device(out, backend.Device.parse(device))
        if copy and out is self:
            out = conversion.clone(self)
        return out

    def type_as(self, other):
        return self.to(other.dtype)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return Tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return creation.zeros(*size, dtype=dtype or self.dtype, device=device or self.device,
                              requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return creation.ones(*size, dtype=dtype or self.dtype, device=device or self.device,
                             requires_grad=requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
        return creation.empty(*size, dtype=dtype or self.dtype, device=device or self.device,
                              requires_grad=requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        return creation.full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                             requires_grad=requires_grad)

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

    def contiguous(self, memory_format=contiguous_format):
        check_contiguous_format("contiguous", memory_format)
        return transform.contiguous(self)

    # -------------------------------------------------------------------------------- in-place
    # Recorded as torch does when grad is needed (history rebased, views write through to their base);
    # otherwise run directly on the memory. See autograd/ops/inplace.py.
    def add_(self, other, alpha=1): return inplace.run(self, Add(), (_scaled(other, alpha),), "add_", "add")
    def sub_(self, other, alpha=1): return inplace.run(self, Sub(), (_scaled(other, alpha),), "sub_", "subtract")
    def mul_(self, other): return inplace.run(self, Mul(), (other,), "mul_", "multiply")
    def pow_(self, exponent): return inplace.run(self, Pow(), (exponent,), "pow_", "power")
    def floor_divide_(self, other): return inplace.run(self, elementwise.FloorDivide(), (other,), "floor_divide_")
    def remainder_(self, other): return inplace.run(self, elementwise.Remainder(), (other,), "remainder_")
    def neg_(self): return inplace.run(self, elementwise.Neg(), (), "neg_", "negative")
    def exp_(self): return inplace.run(self, elementwise.Exp(), (), "exp_", _float_ufunc(self, "exp"))
    def log_(self): return inplace.run(self, elementwise.Log(), (), "log_", _float_ufunc(self, "log"))
    def sqrt_(self): return inplace.run(self, elementwise.Sqrt(), (), "sqrt_", _float_ufunc(self, "sqrt"))
    def tanh_(self): return inplace.run(self, elementwise.Tanh(), (), "tanh_", _float_ufunc(self, "tanh"))
    def sin_(self): return inplace.run(self, elementwise.Sin(), (), "sin_", _float_ufunc(self, "sin"))
    def cos_(self): return inplace.run(self, elementwise.Cos(), (), "cos_", _float_ufunc(self, "cos"))
    def abs_(self): return inplace.run(self, elementwise.Abs(), (), "abs_", "absolute")
    def rsqrt_(self): return inplace.run(self, elementwise.Rsqrt(), (), "rsqrt_")
    def reciprocal_(self): return inplace.run(self, elementwise.Reciprocal(), (), "reciprocal_")
    def sigmoid_(self): return inplace.run(self, activations.Sigmoid(), (), "sigmoid_")
    def relu_(self): return inplace.run(self, activations.ReLU(), (), "relu_")
    def clamp_(self, min=None, max=None): return inplace.run(self, elementwise.Clamp(), (min, max), "clamp_")
    clip_ = clamp_
    def masked_fill_(self, mask, value): return inplace.run(self, transform.MaskedFill(), (mask, value), "masked_fill_")
    def bitwise_and_(self, other): return inplace.run(self, logic.BitwiseAnd(), (other,), "bitwise_and_")
    def bitwise_or_(self, other): return inplace.run(self, logic.BitwiseOr(), (other,), "bitwise_or_")
    def bitwise_xor_(self, other): return inplace.run(self, logic.BitwiseXor(), (other,), "bitwise_xor_")
    def bitwise_left_shift_(self, other): return inplace.run(self, logic.LeftShift(), (other,), "lshift_")
    def bitwise_right_shift_(self, other): return inplace.run(self, logic.RightShift(), (other,), "rshift_")

    def div_(self, other, rounding_mode=None):
        fn = elementwise.division(rounding_mode)
        return inplace.run(self, fn, (other,), "div_", _float_ufunc(self, "divide") if rounding_mode is None else None)

    def copy_(self, src, non_blocking=False):
        return inplace.copy(self, src)

    def fill_(self, value):
        if isinstance(value, Tensor) and value.ndim != 0:
            raise RuntimeError(f"fill_: only supports a 0-dimension value tensor, got one of shape {value.shape}\n"
                               "HINT: use copy_ to write a whole tensor")
        return inplace.copy(self, value)

    def zero_(self):
        return inplace.copy(self, 0)

    def uniform_(self, low=0.0, high=1.0, *, generator=None):
        if self.device is backend.META:  # no storage: nothing drawn or written; recorded for sharded init
            backend.record_init(self, "uniform", float(low), float(high))
            return self
        return inplace.copy(self, draw_source(generator, self.device, "uniform_").uniform(low, high, self.shape))

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        if self.device is backend.META:
            backend.record_init(self, "normal", float(mean), float(std))
            return self
        drawn = draw_source(generator, self.device, "normal_").standard_normal(self.shape)
        return inplace.copy(self, drawn * std + mean)

    def __setitem__(self, index, value):
        inplace.setitem(self, index, value)

    __iadd__ = add_
    __isub__ = sub_
    __imul__ = mul_
    __itruediv__ = div_
    __ifloordiv__ = floor_divide_
    __imod__ = remainder_
    __ipow__ = pow_
    __iand__ = bitwise_and_
    __ior__ = bitwise_or_
    __ixor__ = bitwise_xor_
    __ilshift__ = bitwise_left_shift_
    __irshift__ = bitwise_right_shift_

    # ------------------------------------------------------------------------------- operators
    def __add__(self, other): return elementwise.add(self, other)
    def __radd__(self, other): return elementwise.add(other, self)
    def __sub__(self, other): return elementwise.sub(self, other)
    def __rsub__(self, other): return elementwise.sub(other, self)
    def __mul__(self, other): return elementwise.mul(self, other)
    def __rmul__(self, other): return elementwise.mul(other, self)
    def __truediv__(self, other): return elementwise.div(self, other)
    def __rtruediv__(self, other): return elementwise.div(other, self)
    def __floordiv__(self, other): return elementwise.floor_divide(self, other)
    def __rfloordiv__(self, other): return elementwise.floor_divide(other, self)
    def __mod__(self, other): return elementwise.remainder(self, other)
    def __rmod__(self, other): return elementwise.remainder(other, self)
    def __pow__(self, exponent): return elementwise.pow(self, exponent)
    def __rpow__(self, base): return elementwise.pow(base, self)
    def __matmul__(self, other): return matmul.matmul(self, other)
    def __rmatmul__(self, other): return matmul.matmul(other, self)
    def __neg__(self): return elementwise.neg(self)
    def __pos__(self): return self
    def __abs__(self): return elementwise.abs(self)
    def __eq__(self, other): return logic.eq(self, other)
    def __ne__(self, other): return logic.ne(self, other)
    def __lt__(self, other): return logic.lt(self, other)
    def __le__(self, other): return logic.le(self, other)
    def __gt__(self, other): return logic.gt(self, other)
    def __ge__(self, other): return logic.ge(self, other)
    # bitwise on integers, logical on bool (as torch); floats are refused
    def __and__(self, other): return logic.bitwise_and(self, other)
    def __rand__(self, other): return logic.bitwise_and(other, self)
    def __or__(self, other): return logic.bitwise_or(self, other)
    def __ror__(self, other): return logic.bitwise_or(other, self)
    def __xor__(self, other): return logic.bitwise_xor(self, other)
    def __rxor__(self, other): return logic.bitwise_xor(other, self)
    def __lshift__(self, other): return logic.bitwise_left_shift(self, other)
    def __rlshift__(self, other): return logic.bitwise_left_shift(other, self)
    def __rshift__(self, other): return logic.bitwise_right_shift(self, other)
    def __rrshift__(self, other): return logic.bitwise_right_shift(other, self)
    def __invert__(self): return logic.bitwise_not(self)

    __hash__ = object.__hash__

    def __getitem__(self, index):
        return indexing.getitem(self, index)

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
    def add(self, other, alpha=1): return elementwise.add(self, _scaled(other, alpha))
    def sub(self, other, alpha=1): return elementwise.sub(self, _scaled(other, alpha))
    def mul(self, other): return elementwise.mul(self, other)
    def div(self, other, rounding_mode=None): return elementwise.div(self, other, rounding_mode=rounding_mode)
    def floor_divide(self, other): return elementwise.floor_divide(self, other)
    def remainder(self, other): return elementwise.remainder(self, other)
    def exp(self): return elementwise.exp(self)
    def log(self): return elementwise.log(self)
    def sqrt(self): return elementwise.sqrt(self)
    def rsqrt(self): return elementwise.rsqrt(self)
    def tanh(self): return elementwise.tanh(self)
    def sin(self): return elementwise.sin(self)
    def cos(self): return elementwise.cos(self)
    def abs(self): return elementwise.abs(self)
    def neg(self): return elementwise.neg(self)
    def square(self): return elementwise.mul(self, self)
    def pow(self, exponent): return elementwise.pow(self, exponent)
    def reciprocal(self): return elementwise.reciprocal(self)
    def clamp(self, min=None, max=None): return elementwise.clamp(self, min, max)
    clip = clamp
    def maximum(self, other): return elementwise.maximum(self, other)
    def minimum(self, other): return elementwise.minimum(self, other)
    def isfinite(self): return logic.isfinite(self)
    def isnan(self): return logic.isnan(self)
    def isinf(self): return logic.isinf(self)
    def logical_and(self, other): return logic.logical_and(self, other)
    def logical_or(self, other): return logic.logical_or(self, other)
    def logical_xor(self, other): return logic.logical_xor(self, other)
    def logical_not(self): return logic.logical_not(self)
    def bitwise_and(self, other): return logic.bitwise_and(self, other)
    def bitwise_or(self, other): return logic.bitwise_or(self, other)
    def bitwise_xor(self, other): return logic.bitwise_xor(self, other)
    def bitwise_not(self): return logic.bitwise_not(self)
    def matmul(self, other): return matmul.matmul(self, other)
    def mm(self, other): return matmul.mm(self, other)
    def bmm(self, other): return matmul.bmm(self, other)
    def baddbmm(self, batch1, batch2, beta=1, alpha=1): return matmul.baddbmm(self, batch1, batch2, beta, alpha)
    def sigmoid(self): return activations.sigmoid(self)
    def relu(self): return activations.relu(self)
    def softmax(self, dim=-1): return softmax.softmax(self, dim)
    def log_softmax(self, dim=-1): return softmax.log_softmax(self, dim)

    # ---------------------------------------------------------------------------- reductions
    def sum(self, dim=None, keepdim=False, dtype=None): return reduction.sum(self, dim, keepdim, dtype=dtype)
    def mean(self, dim=None, keepdim=False, dtype=None): return reduction.mean(self, dim, keepdim, dtype=dtype)
    def max(self, dim=None, keepdim=False): return reduction.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return reduction.min(self, dim, keepdim)
    def amax(self, dim=(), keepdim=False): return reduction.amax(self, dim, keepdim)
    def amin(self, dim=(), keepdim=False): return reduction.amin(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return reduction.argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return reduction.argmin(self, dim, keepdim)
    def all(self, dim=None, keepdim=False): return reduction.all(self, dim, keepdim)
    def any(self, dim=None, keepdim=False): return reduction.any(self, dim, keepdim)
    def cumsum(self, dim, dtype=None): return scan.cumsum(self, dim, dtype=dtype)
    def cumprod(self, dim, dtype=None): return scan.cumprod(self, dim, dtype=dtype)
    def sort(self, dim=-1, descending=False, stable=False): return sorting.sort(self, dim, descending, stable)
    def argsort(self, dim=-1, descending=False, stable=False): return sorting.argsort(self, dim, descending, stable)
    def topk(self, k, dim=-1, largest=True, sorted=True): return sorting.topk(self, k, dim, largest, sorted)

    # ---------------------------------------------------------------------------- shape methods
    def reshape(self, *shape): return transform.reshape(self, _shape_arg(shape))
    def view(self, *shape): return transform.view(self, _shape_arg(shape))
    def view_as(self, other): return transform.view(self, other.shape)
    def reshape_as(self, other): return transform.reshape(self, other.shape)
    def transpose(self, dim0, dim1): return transform.transpose(self, dim0, dim1)
    def permute(self, *dims): return transform.permute(self, _shape_arg(dims))
    def unsqueeze(self, dim): return transform.unsqueeze(self, dim)
    def squeeze(self, dim=None): return transform.squeeze(self, dim)
    def expand(self, *shape): return transform.expand(self, _shape_arg(shape))
    def expand_as(self, other): return transform.expand(self, other.shape)
    def repeat(self, *sizes): return transform.repeat(self, _shape_arg(sizes))
    def flatten(self, start_dim=0, end_dim=-1): return transform.flatten(self, start_dim, end_dim)
    def repeat_interleave(self, repeats, dim=None, *, output_size=None):
        return transform.repeat_interleave(self, repeats, dim, output_size=output_size)
    def masked_fill(self, mask, value): return transform.masked_fill(self, mask, value)
    def tril(self, diagonal=0): return transform.tril(self, diagonal)
    def triu(self, diagonal=0): return transform.triu(self, diagonal)
    def split(self, split_size_or_sections, dim=0): return joins.split(self, split_size_or_sections, dim)
    def chunk(self, chunks, dim=0): return joins.chunk(self, chunks, dim)
    def gather(self, dim, index): return indexing.gather(self, dim, index)
    def index_select(self, dim, index): return indexing.index_select(self, dim, index)

    def t(self):
        if self.ndim > 2:
            raise ValueError(f"t: expects a tensor with <= 2 dims, got {self.ndim}.\nHINT: use .transpose(d0, d1)")
        return self if self.ndim < 2 else transform.transpose(self, 0, 1)

    @property
    def T(self):
        return transform.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self):
        return transform.transpose(self, -2, -1)


def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


def _float_ufunc(t, name):
    """The ufunc for an in-place float op, or None for integer tensors (the op's own dtype error then applies)."""
    return name if backend.is_floating(t.array.dtype) else None


def _shape_arg(shape):
    """Accept f(2, 3) and f((2, 3)) alike."""
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        return tuple(int(s) for s in shape[0])
    return tuple(int(s) for s in shape)


def array_of(value):
    """The array a Tensor holds; anything else (an array, a scalar) as it is."""
    return value.array if isinstance(value, Tensor) else value


# Bound after the class exists: the op families import Tensor from this module.
from . import creation  # noqa: E402
from .autograd.ops import (  # noqa: E402
    activations,
    conversion,
    elementwise,
    indexing,
    inplace,
    joins,
    logic,
    matmul,
    reduction,
    scan,
    softmax,
    sorting,
    transform,
)
from .autograd.ops.elementwise import Add, Mul, Pow, Sub  # noqa: E402
