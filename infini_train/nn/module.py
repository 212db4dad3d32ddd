"""Module and Parameter: registration of parameters, buffers and submodules, state dicts, hooks."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import backend
from ..autograd.function import RemovableHandle
from ..autograd.grad_mode import no_grad
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor that a Module registers as a trainable parameter (requires grad by default)."""

    __slots__ = ()

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = np.zeros((0,), np.float32)
        if isinstance(data, Tensor):
            array, dev = data.array, data.device
        else:
            array = data if hasattr(data, "dtype") and hasattr(data, "shape") else np.asarray(data, np.float32)
            dev = backend.device_of_array(array)
        # shares memory with the source, as torch.nn.Parameter does
        self.array = array
        self.device = dev
        self._requires_grad = False
        self.grad = None
        self.grad_fn = None
        self._output_idx = 0
        self._version = [0]
        self._accumulate = None
        self.requires_grad = requires_grad

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self.detach())


class Module:
    """Base class of layers and models. Assigning a Parameter, Module or (via register_buffer) Tensor to
    an attribute registers it; ``__call__`` runs forward with the registered hooks."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "_forward_pre_hooks", [])
        object.__setattr__(self, "training", True)

    # ------------------------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        params, modules, buffers = d["_parameters"], d["_modules"], d["_buffers"]
        if isinstance(value, (Parameter, Module)):
            for table in (params, modules, buffers):
                table.pop(name, None)
            d.pop(name, None)
            (params if isinstance(value, Parameter) else modules)[name] = value
        elif name in params or name in modules:
            if value is not None:
                kind = "parameter" if name in params else "submodule"
                raise TypeError(f"cannot assign {type(value).__name__} as {kind} {name!r} "
                                f"(expected a {'Parameter' if kind == 'parameter' else 'Module'} or None)")
            (params if name in params else modules)[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer {name!r} (expected a Tensor)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None, got {type(param).__name__}")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)
        else:
            self._non_persistent.discard(name)

    def add_module(self, name, module):
        self._modules[name] = module

    # -------------------------------------------------------------------------------- iteration
    def named_modules(self, prefix="", memo=None):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self):
        return (m for _, m in self.named_children())

    def _named_members(self, table, recurse=True):
        seen = set()
        mods = self.named_modules() if recurse else [("", self)]
        for prefix, mod in mods:
            for name, value in getattr(mod, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{prefix}.{name}" if prefix else name), value

    def named_parameters(self, recurse=True):
        """(dotted name, Parameter) pairs; a parameter shared by two modules (tied weights) appears once."""
        return self._named_members("_parameters", recurse)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse))

    def named_buffers(self, recurse=True):
        return self._named_members("_buffers", recurse)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse))

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------------------- state dict
    def state_dict(self, prefix=""):
        """Ordered {dotted name: detached tensor}, parameters then buffers per module; tied weights appear
        under every name, as in torch."""
        out = OrderedDict()
        for mod_prefix, mod in self.named_modules(prefix.rstrip(".")):
            base = f"{mod_prefix}." if mod_prefix else ""
            for name, p in mod._parameters.items():
                if p is not None:
                    out[base + name] = p.detach()
            for name, b in mod._buffers.items():
                if b is not None and name not in mod._non_persistent:
                    out[base + name] = b.detach()
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Copy values into the existing parameters and buffers (they keep their identity, so optimizers
        holding them stay valid). ``strict`` requires exactly the same keys."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            arr = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if tuple(arr.shape) != tuple(target.shape):
                problems.append(f"  size mismatch for {key}: expected shape {tuple(target.shape)}, "
                                f"got {tuple(arr.shape)}")
        if strict and (missing or unexpected):
            problems.insert(0, "  missing keys: " + (", ".join(missing) or "none"))
            problems.insert(1, "  unexpected keys: " + (", ".join(unexpected) or "none"))
        if problems:
            raise RuntimeError(f"load_state_dict: error(s) loading into {type(self).__name__}:\n" + "\n".join(problems)
                               + "\nHINT: was the checkpoint saved from a model with the same configuration?")
        with no_grad():
            for key, target in own.items():
                if key in state_dict:
                    value = state_dict[key]
                    target.copy_(value if isinstance(value, Tensor) else np.asarray(value))
        return missing, unexpected

    # ------------------------------------------------------------------------------ mode, device
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def apply(self, fn):
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args, dtype=None, device=None):
        """Move/cast parameters and buffers in place (Parameter objects are kept)."""
        for a in args:
            if isinstance(a, (str, backend.Device)) and str(a).split(":")[0] in ("cpu", "cuda"):
                device = a
            else:
                dtype = a
        dev = backend.Device.parse(device) if device is not None else None
        dt = backend.as_dtype(dtype) if dtype is not None else None
        seen = set()
        for mod in self.modules():
            for table in (mod._parameters, mod._buffers):
                for t in table.values():
                    if t is None or id(t) in seen:
                        continue
                    seen.add(id(t))
                    _move_in_place(t, dev, dt)
        return self

    def cpu(self):
        return self.to(device="cpu")

    def cuda(self, index=0):
        return self.to(device=f"cuda:{index}")

    def float(self):
        return self.to(dtype=backend.float32)

    def double(self):
        return self.to(dtype=backend.float64)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                with no_grad():
                    p.grad.zero_()

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    # ----------------------------------------------------------------------------------- calls
    def register_forward_hook(self, hook):
        """``hook(module, inputs, output) -> None | new output`` after every forward."""
        self._forward_hooks.append(hook)
        return RemovableHandle(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook):
        """``hook(module, inputs) -> None | new inputs`` before every forward."""
        self._forward_pre_hooks.append(hook)
        return RemovableHandle(self._forward_pre_hooks, hook)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def __call__(self, *args, **kwargs):
        for hook in self._forward_pre_hooks:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        out = self.forward(*args, **kwargs)
        for hook in self._forward_hooks:
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    # ------------------------------------------------------------------------------------ repr
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        for name, child in self._modules.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"({name}): {body}")
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        head = f"{type(self).__name__}(" + (f"{extra}" if extra else "")
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _move_in_place(t, device, dtype):
    array = t.array
    if dtype is not None and array.dtype != dtype and backend.is_floating(array.dtype):
        array = array.astype(dtype)
    if device is not None and device is not t.device:
        array = backend.to_device_array(array, device)
        t.device = device
        if t._accumulate is not None:  # keep the leaf node (and any hooks on it), on the new device
            t._accumulate.device = device
            t._accumulate.xp = device.array_module()
    if array is not t.array:
        t.array = array
        t._version[0] += 1
    if t.grad is not None and (t.grad.device is not t.device or t.grad.dtype != array.dtype):
        t.grad = None
