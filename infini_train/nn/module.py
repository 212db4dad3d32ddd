"""Module and Parameter: registration of parameters, buffers and submodules, state dicts, hooks."""
from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy as np

from .. import backend
from ..autograd.hooks import RemovableHandle
from ..placement import REPLICATED
from ..tensor import Tensor
from .backward_hooks import GLOBAL_BACKWARD_HOOKS, GLOBAL_BACKWARD_PRE_HOOKS, BackwardHook
from .state_dict_load import LoadWalk

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Parameter(Tensor):
    """A Tensor that a Module registers as a trainable parameter (requires grad by default).

    ``Parameter(tensor_or_array, requires_grad=True)`` shares memory with a Tensor or array source, as
    torch.nn.Parameter does; lists and scalars are converted to float32. ``placement``: where its values live across
    ranks (infini_train.placement: a tensor-parallel shard, a fully_shard flat piece, an expert, a tied copy);
    ``init_source``: for a shard or copy of a parameter built on the meta device, that parameter (sharded
    initialisation gives it its values), else None.
    """

    __slots__ = ("placement", "init_source")

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = np.zeros((0,), backend.get_default_dtype())
        if isinstance(data, Tensor):
            array, dev = data.array, data.device
        elif backend.is_array_like(data):
            array, dev = data, backend.device_of_array(data)
        else:
            array, dev = np.asarray(data, backend.get_default_dtype()), backend.CPU
        self._init_slots(array, dev, version=data._version if isinstance(data, Tensor) else None)
        self.placement, self.init_source = REPLICATED, None
        self.requires_grad = requires_grad

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self.detach())


def _check_name(kind, module, name):
    if not isinstance(name, str):
        raise TypeError(f"{kind}: name must be a str, got {type(name).__name__}")
    if not name or "." in name:
        raise KeyError(f"{kind}: name must be non-empty and contain no '.', got {name!r}")
    d = module.__dict__
    if "_parameters" not in d:
        raise AttributeError(f"{kind}: call super().__init__() in {type(module).__name__}.__init__ first")
    if name in d:
        raise KeyError(f"{kind}: {type(module).__name__} already has a plain attribute {name!r}")


def _add_indent(text, spaces=2):
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    pad = " " * spaces
    return lines[0] + "\n" + "\n".join(pad + line for line in lines[1:])


class Module:
    """Base class of layers and models. Assigning a Parameter or Module to an attribute registers it
    (buffers go through ``register_buffer``); ``__call__`` runs ``forward`` with the registered hooks."""

    _version = 1  # the state_dict metadata's "version", as torch's (a load pre-hook may convert older layouts)
    _hooked = False  # True once a forward/backward hook was registered on the instance (or globally, on the class)
    # hook lists a module gets on its first registration (_register)
    _backward_hooks = _backward_pre_hooks = ()
    _state_dict_pre_hooks = _state_dict_hooks = ()
    _load_state_dict_pre_hooks = _load_state_dict_post_hooks = ()

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
        params, modules, buffers = d.get("_parameters"), d.get("_modules"), d.get("_buffers")
        if isinstance(value, (Parameter, Module)):
            if params is None:
                raise AttributeError(f"cannot assign {type(value).__name__} {name!r} before "
                                     f"Module.__init__() was called\nHINT: call super().__init__() first in "
                                     f"{type(self).__name__}.__init__")
            target = params if isinstance(value, Parameter) else modules
            for table in (params, modules, buffers):
                if table is not target:  # re-assigning keeps the entry's place in the order, as in torch
                    table.pop(name, None)
            d.pop(name, None)
            self._non_persistent.discard(name)
            target[name] = value
        elif params is not None and (name in params or name in modules):
            if value is not None:
                kind, want = ("parameter", "Parameter") if name in params else ("submodule", "Module")
                raise TypeError(f"cannot assign {type(value).__name__} as {kind} {name!r} (expected a {want} "
                                f"or None)")
            (params if name in params else modules)[name] = None
        elif buffers is not None and name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer {name!r} (expected a Tensor or None)")
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
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: {name!r} must be a Parameter or None, got {type(param).__name__}")
        if name not in self._parameters:
            _check_name("register_parameter", self, name)
            if name in self._buffers or name in self._modules:
                raise KeyError(f"register_parameter: {name!r} is already a buffer or submodule")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """A Tensor that is part of the module's state (moved by ``to``) but is not a parameter; persistent
        buffers appear in ``state_dict``."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: {name!r} must be a Tensor or None, got {type(tensor).__name__}")
        if name not in self._buffers:
            _check_name("register_buffer", self, name)
            if name in self._parameters or name in self._modules:
                raise KeyError(f"register_buffer: {name!r} is already a parameter or submodule")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r} must be a Module or None, got {type(module).__name__}")
        if name not in self._modules:
            _check_name("add_module", self, name)
            if name in self._parameters or name in self._buffers:
                raise KeyError(f"add_module: {name!r} is already a parameter or buffer")
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target):
        """The submodule at a dotted path (``"transformer.h.0.attn"``); ``""`` is this module."""
        mod = self
        for part in target.split(".") if target else []:
            child = mod._modules.get(part)
            if child is None:
                raise AttributeError(f"get_submodule: {type(mod).__name__} has no submodule {part!r} "
                                     f"(looking up {target!r})")
            mod = child
        return mod

    def get_parameter(self, target):
        prefix, _, name = target.rpartition(".")
        mod = self.get_submodule(prefix)
        if mod._parameters.get(name) is None:
            raise AttributeError(f"get_parameter: {type(mod).__name__} has no parameter {name!r} "
                                 f"(looking up {target!r})")
        return mod._parameters[name]

    # -------------------------------------------------------------------------------- iteration
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) pairs, this module first (name ``prefix``), depth first in registration order."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, table, prefix, recurse, remove_duplicate):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mod_prefix, mod in mods:
            for name, value in getattr(mod, table).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Parameter) pairs; a parameter shared by two modules (tied weights) appears once,
        under the name where it is first found."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self, only_trainable=False):
        """Number of parameter elements (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not only_trainable)

    # ------------------------------------------------------------------------------- state dict
    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """Ordered {dotted name: tensor}: each module's parameters, then its persistent buffers, then its
        children's entries. Tied weights appear under every name, as in torch. Values are detached
        tensors sharing memory with the module's (the Parameters themselves with ``keep_vars=True``); a parameter
        fully_shard keeps sharded gives this rank's shard with its placement (a ShardedTensor, as FSDP2 gives a
        DTensor). As in torch, the dict carries ``_metadata`` ({prefix: {"version": ...}}) and each module runs its
        state-dict pre-hooks before its entries and its post-hooks after its subtree's."""
        for hook in list(self._state_dict_pre_hooks):
            hook(self, prefix, keep_vars)
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = {"version": self._version}
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else _state_value(p)
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                destination[prefix + name] = b if keep_vars else b.detach()
        for name, child in self._modules.items():
            if child is not None:
                child.state_dict(destination, prefix + name + ".", keep_vars)
        for hook in list(self._state_dict_hooks):
            if hook(self, destination, prefix, local_metadata) is not None:
                raise RuntimeError("state_dict post-hook must return None\nHINT: change the state_dict it is "
                                   "given in place")
        return destination

    def load_state_dict(self, state_dict, strict=True):
        """Copy values (Tensors or arrays) into the existing parameters and buffers; they keep their identity,
        so optimizers holding them stay valid. ``strict`` requires exactly the same keys; shapes must always
        match. A parameter fully_shard keeps sharded takes a ShardedTensor of its placement or the whole tensor
        (this rank keeps its shard of it). Load pre- and post-hooks run as in torch (parent's pre-hooks first,
        post-hooks once a module's subtree is loaded). Returns ``(missing_keys, unexpected_keys)``."""
        metadata = getattr(state_dict, "_metadata", None)
        state = OrderedDict(state_dict)
        if metadata is not None:
            state._metadata = metadata
        walk = LoadWalk(metadata, IncompatibleKeys)
        walk.visit(self, state, "")
        missing, unexpected = walk.missing, walk.unexpected
        problems = []
        if strict and missing:
            problems.append(f"  missing keys ({len(missing)}): " + ", ".join(missing))
        if strict and unexpected:
            problems.append(f"  unexpected keys ({len(unexpected)}): " + ", ".join(unexpected))
        problems += walk.size_errors + [f"  {msg}" for msg in walk.errors]
        if problems:
            raise RuntimeError(f"load_state_dict: error(s) loading state_dict into {type(self).__name__}:\n"
                               + "\n".join(problems) + "\nHINT: " + _load_hint(missing, unexpected))
        walk.copy_pending()
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------------------ mode, device
    def train(self, mode=True):
        """Set ``training`` on this module and every submodule (Dropout reads it)."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def apply(self, fn):
        """Call ``fn(module)`` on every submodule (children first) and then on this module."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, *args, dtype=None, device=None):
        """Move and/or cast (floating) parameters, buffers and their grads in place; the Parameter objects
        are kept, so optimizers stay valid. ``to("cuda:0")``, ``to(it.float64)``, ``to(device, dtype)``."""
        for a in args:
            if isinstance(a, backend.Device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
                device = a
            else:
                dtype = a
        dev = backend.Device.parse(device) if device is not None else None
        dt = backend.as_dtype(dtype) if dtype is not None else None
        if dt is not None and not backend.is_floating(dt):
            raise TypeError(f"Module.to: only floating dtypes are supported, got {dt}")
        for t in self._own_tensors():
            _move_in_place(t, dev, dt)
        return self

    def _own_tensors(self):
        """Every parameter and buffer of the module tree, once each (tied ones too)."""
        seen = set()
        for mod in self.modules():
            for table in (mod._parameters, mod._buffers):
                for t in table.values():
                    if t is not None and id(t) not in seen:
                        seen.add(id(t))
                        yield t

    def to_empty(self, *, device):
        """Give every parameter and buffer fresh, uninitialised storage on ``device`` (a model built under
        ``with it.device("meta"):`` holds none), keeping the Parameter objects; fill them next (a checkpoint load,
        an init)."""
        dev = backend.Device.parse(device)
        for t in self._own_tensors():
            flat_shard = t.placement.flat_shard
            if flat_shard is not None:  # fully_shard's storage: only this rank's shard gets storage
                flat_shard.to_empty(dev)
            else:
                with dev.context():
                    t.array = dev.array_module().empty(t.array.shape, t.array.dtype)
            t.device = dev
            if t._accumulate is not None:
                t._accumulate.device, t._accumulate.xp = dev, dev.array_module()
            t.grad = None
            t._version[0] += 1
        return self

    def cpu(self):
        return self.to(device="cpu")

    def cuda(self, index=0):
        return self.to(device=f"cuda:{index}")

    def float(self):
        return self.to(dtype=backend.float32)

    def double(self):
        return self.to(dtype=backend.float64)

    def half(self):
        return self.to(dtype=backend.float16)

    def bfloat16(self):
        if backend.bfloat16 is None:
            raise RuntimeError("Module.bfloat16: bfloat16 needs the ml_dtypes package on CPU\nHINT: pip install "
                               "ml_dtypes, or use half()")
        return self.to(dtype=backend.bfloat16)

    def zero_grad(self, set_to_none=True):
        from .utils import zero_grad
        zero_grad(self.parameters(), set_to_none)

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    # ----------------------------------------------------------------------------------- calls
    def register_forward_hook(self, hook, *, prepend=False):
        """``hook(module, args, output) -> None | new output`` after every forward; returns a handle
        whose ``remove()`` unregisters it. ``prepend``: run it before the hooks already registered."""
        return _register(self, "register_forward_hook", "_forward_hooks", hook, prepend, call_hook=True)

    def register_forward_pre_hook(self, hook, *, prepend=False):
        """``hook(module, args) -> None | new args`` before every forward (a non-tuple is wrapped)."""
        return _register(self, "register_forward_pre_hook", "_forward_pre_hooks", hook, prepend, call_hook=True)

    def register_full_backward_hook(self, hook, prepend=False):
        """``hook(module, grad_input, grad_output) -> None | new grad_input`` once the gradients w.r.t. the
        module's positional tensor inputs are computed (torch's full backward hook: grad_input has one entry per
        positional argument, None where it is no tensor or needs no gradient; returning a tuple replaces it)."""
        return _register(self, "register_full_backward_hook", "_backward_hooks", hook, prepend, call_hook=True)

    def register_full_backward_pre_hook(self, hook, prepend=False):
        """``hook(module, grad_output) -> None | new grad_output`` when the gradients w.r.t. the module's outputs
        are computed, before the module's backward (one entry per output, None where none came)."""
        return _register(self, "register_full_backward_pre_hook", "_backward_pre_hooks", hook, prepend, call_hook=True)

    def register_state_dict_pre_hook(self, hook):
        """``hook(module, prefix, keep_vars) -> None`` before this module's ``state_dict`` entries are taken."""
        return _register(self, "register_state_dict_pre_hook", "_state_dict_pre_hooks", hook)

    def register_state_dict_post_hook(self, hook):
        """``hook(module, state_dict, prefix, local_metadata) -> None`` after this module's (and its children's)
        entries are in ``state_dict``; it may change ``state_dict`` in place (rename, drop, add keys)."""
        return _register(self, "register_state_dict_post_hook", "_state_dict_hooks", hook)

    def register_load_state_dict_pre_hook(self, hook):
        """``hook(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)``
        before this module takes its entries; ``state_dict`` holds the entries under ``prefix`` and may be changed
        in place (checkpoint conversion: rename or reshape keys). ``strict`` is always True there, as in torch."""
        return _register(self, "register_load_state_dict_pre_hook", "_load_state_dict_pre_hooks", hook)

    def register_load_state_dict_post_hook(self, hook):
        """``hook(module, incompatible_keys) -> None`` once this module's subtree is loaded; it may change
        ``incompatible_keys.missing_keys`` / ``.unexpected_keys`` in place (a strict load checks them after)."""
        return _register(self, "register_load_state_dict_post_hook", "_load_state_dict_post_hooks", hook)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def __call__(self, *args, **kwargs):
        if not self._hooked:  # one check while no hook was ever registered here or globally
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    def _call_with_hooks(self, args, kwargs):
        full_hooks = [*GLOBAL_BACKWARD_HOOKS, *self._backward_hooks]  # global ones first, as in torch
        pre_hooks = [*GLOBAL_BACKWARD_PRE_HOOKS, *self._backward_pre_hooks]
        for hook in list(self._forward_pre_hooks):
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        backward_hook = None
        if full_hooks or pre_hooks:
            backward_hook = BackwardHook(self, full_hooks, pre_hooks)
            args = backward_hook.setup_inputs(args)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks):
            result = hook(self, args, out)
            if result is not None:
                out = result
        if backward_hook is not None:
            out = backward_hook.setup_outputs(out)
        return out

    # ------------------------------------------------------------------------------------ repr
    def extra_repr(self):
        """One-line description of the module's own settings, shown in ``repr``."""
        return ""

    def __repr__(self):  # torch's layout, so printed models read the same
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _add_indent(repr(child)) for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        text = type(self).__name__ + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


def _register(module, method, name, hook, prepend=False, call_hook=False):
    if not callable(hook):
        raise TypeError(f"{type(module).__name__}.{method}: expected a callable hook, got {type(hook).__name__}")
    hooks = module.__dict__.get(name)
    if hooks is None:
        hooks = []
        object.__setattr__(module, name, hooks)
    if prepend:
        hooks.insert(0, hook)
    else:
        hooks.append(hook)
    if call_hook:
        object.__setattr__(module, "_hooked", True)
    return RemovableHandle(hooks, hook)


class _GlobalHookHandle(RemovableHandle):
    """Removing the last global hook lets unhooked modules skip the hooks again."""

    __slots__ = ()

    def remove(self):
        super().remove()
        Module._hooked = bool(GLOBAL_BACKWARD_HOOKS or GLOBAL_BACKWARD_PRE_HOOKS)


def _register_global(hooks, hook, what):
    if not callable(hook):
        raise TypeError(f"{what}: expected a callable hook, got {type(hook).__name__}")
    hooks.append(hook)
    Module._hooked = True
    return _GlobalHookHandle(hooks, hook)


def register_module_full_backward_hook(hook):
    """A full backward hook for every module (torch.nn.modules.module's), run before each module's own."""
    return _register_global(GLOBAL_BACKWARD_HOOKS, hook, "register_module_full_backward_hook")


def register_module_full_backward_pre_hook(hook):
    """A full backward pre-hook for every module, run before each module's own."""
    return _register_global(GLOBAL_BACKWARD_PRE_HOOKS, hook, "register_module_full_backward_pre_hook")


def _state_value(p):
    """A parameter as state_dict gives it: detached, or this rank's shard of a fully_shard parameter (unless it is
    gathered whole, inside ``unsharded()``)."""
    flat_shard = p.placement.flat_shard
    return p.detach() if flat_shard is None or flat_shard.whole_gathered else flat_shard.local_shard(p)


def _load_hint(missing, unexpected):
    for wrapper in ("module.", "_orig_mod."):
        if unexpected and all(k.startswith(wrapper) for k in unexpected) and \
                {k[len(wrapper):] for k in unexpected} >= set(missing):
            return f"the checkpoint's keys carry a {wrapper!r} prefix (saved from a wrapped model); strip it, " \
                   f"or load into the wrapper"
        if missing and all(k.startswith(wrapper) for k in missing) and \
                {k[len(wrapper):] for k in missing} <= set(unexpected):
            return f"this model is a wrapper whose keys carry a {wrapper!r} prefix (DistributedDataParallel, " \
                   f"DataParallel) and the checkpoint's do not; load it into the wrapped model (ddp.module), or " \
                   f"add the prefix"
    return "was the checkpoint saved from a model with the same configuration? strict=False ignores missing " \
           "and unexpected keys (shapes must still match)"


def _move_in_place(t, device, dtype):
    cast = dtype is not None and t.array.dtype != dtype and backend.is_floating(t.array.dtype)
    move = device is not None and device is not t.device
    if not cast and not move:
        return
    if t.device is backend.META:
        from ..autograd.ops.conversion import meta_copy_error
        raise meta_copy_error("Module.to")
    t.array = _convert(t.array, device if move else None, dtype if cast else None)
    if move:
        t.device = device
        if t._accumulate is not None:  # keep the leaf node (and any hooks on it), on the new device
            t._accumulate.device = device
            t._accumulate.xp = device.array_module()
    t._version[0] += 1
    g = t.grad
    if g is not None:
        g.array = _convert(g.array, device if move else None, dtype if cast else None)
        g.device = t.device
        g._version[0] += 1


def _convert(array, device, dtype):
    if dtype is not None:
        array = array.astype(dtype)
    if device is not None:
        array = backend.to_device_array(array, device)
    return array
