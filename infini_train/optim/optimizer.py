"""Optimizer base: parameter groups with per-group options, per-parameter state, state_dict round trips.

``state`` maps each parameter (by identity) to its dict of arrays and counters (keys starting with "_" are
private and left out of ``state_dict``).

Steps allocate nothing: updates are ``out=`` ufuncs on the state arrays and on a scratch workspace that the
optimizer keeps per (device, dtype). On CPU devices the update runs over ``CPU_CHUNK``-element pieces of
each parameter, so a piece of every array stays in cache across the update's passes (about 1.8x faster
than whole-array passes for Adam) and the workspace stays small, and a large parameter's pieces are shared
among the host threads (``it.set_num_threads``; the same bits, each element's update is unchanged); on GPUs
a parameter is one piece.

Where the state arrays live is the optimizer's ``state_store`` (offload.py; ``train.optimizer_offload``): in memory
beside the parameters, in host memory or in a file per rank. An optimizer asks its store for new and restored state
arrays and for the chunks its update runs on; state dicts read the arrays through it, so they hold the same values
wherever the state lives.
"""
from __future__ import annotations

import copy
import functools

from .. import backend, host_threads
from ..autograd import observers
from ..autograd.grad_mode import enable_grad, no_grad
from ..distributed.sharded_tensor import ShardedTensor, ShardView
from ..nn.utils import zero_grad
from ..tensor import Tensor, array_of
from .offload import InMemory
from .param_groups import group_sizes, numbering, packed_groups, paired

# set by schedulers (OneCycleLR keeps its bounds in the groups, as torch does) / users for bookkeeping
_EXTRA_GROUP_KEYS = {"initial_lr", "name", "max_lr", "min_lr", "max_momentum", "base_momentum"}
CPU_CHUNK = 1 << 16  # elements per piece on CPU devices (5 float32 arrays x 256 kB: fits in L2 cache)
# per piece when host threads share a parameter: smaller pieces spend the time handing the GIL back and forth
THREADED_CPU_CHUNK = 1 << 17


def _observed_step(step):
    """``step`` as an ``Optimizer.step#<Class>.step`` range for the op observers (the profiler's optimizer steps);
    one list test when none is installed."""
    @functools.wraps(step)
    def run(self, *args, **kwargs):
        if not observers.ACTIVE:
            return step(self, *args, **kwargs)
        with observers.record(f"Optimizer.step#{type(self).__name__}.step", "optimizer"):
            return step(self, *args, **kwargs)
    return run


def _stepped(p):
    """What an optimizer updates for ``p``: the parameter, or for one sharded by fully_shard, this rank's shard."""
    flat_shard = p.placement.flat_shard
    return p if flat_shard is None else flat_shard.shard_views[id(p)]


class Optimizer:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:  # every optimizer's own step is seen by the profiler
            cls.step = _observed_step(cls.step)

    def __init__(self, params, defaults, state_store=None):
        name = type(self).__name__
        if isinstance(params, Tensor):
            raise TypeError(f"{name}: params must be an iterable of Tensors or of param-group dicts, got a Tensor"
                            "\nHINT: pass [tensor] or model.parameters()")
        self.defaults = dict(defaults)
        self.state = {}  # param -> dict (Tensor hashes by identity)
        self.state_store = state_store or InMemory()  # where the state arrays live (offload.py)
        self._workspaces = {}  # (device, dtype, host thread) -> 2-D scratch array, grown on demand
        self.param_groups = []
        params = list(params)
        if not params:
            raise ValueError(f"{name}: got an empty parameter list")
        for group in params if isinstance(params[0], dict) else [{"params": params}]:
            self.add_param_group(group)

    @property
    def whole_param_groups(self):
        """The param groups over every parameter this optimizer updates, as its state dict numbers them (ZeRO's
        ``param_groups`` hold only this rank's pieces)."""
        return self.param_groups

    def state_bytes(self):
        """Bytes of the per-parameter state arrays this optimizer holds beside the parameters (AdamW's moments; none
        when they are offloaded: ``offloaded_bytes``)."""
        return sum(v.nbytes for v in self._state_arrays() if not self.state_store.offloaded(v))

    def offloaded_bytes(self):
        """Bytes of the per-parameter state arrays kept away from the parameters' memory (``state_store.kind``: in a
        file, or in host memory), 0 without offload."""
        return sum(v.nbytes for v in self._state_arrays() if self.state_store.offloaded(v))

    def _state_arrays(self):
        return [v for st in self.state.values() for v in st.values() if backend.is_array_like(v)]

    def grad_bytes(self):
        """Bytes of the gradients of the parameters this optimizer updates."""
        return sum(p.grad.array.nbytes for g in self.param_groups for p in g["params"] if p.grad is not None)

    def add_param_group(self, group):
        """Add ``{"params": [...], option: value, ...}``; options not given take the optimizer's defaults."""
        name = type(self).__name__
        group = dict(group)
        params = group["params"]
        group["params"] = [_stepped(p) for p in ([params] if isinstance(params, Tensor) else list(params))]
        unknown = set(group) - set(self.defaults) - {"params"} - _EXTRA_GROUP_KEYS
        if unknown:
            raise ValueError(f"{name}: unknown param group option(s) {sorted(unknown)}; expected "
                             f"{sorted(self.defaults)}")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"{name}: can't optimize a non-leaf Tensor\nHINT: optimize the leaf parameters "
                                 "(model.parameters()), not results computed from them")
            if id(p) in seen:
                raise ValueError(f"{name}: a parameter appears in more than one param group (or twice in one)")
            seen.add(id(p))
        self.param_groups.append(group)

    def zero_grad(self, set_to_none=True):
        zero_grad((p for g in self.param_groups for p in g["params"]), set_to_none)

    def step(self, closure=None):
        """One update of every parameter with a gradient; ``closure`` (optional) re-evaluates the loss first and
        its result is returned (None without one)."""
        raise NotImplementedError(f"{type(self).__name__} must implement step")

    @staticmethod
    def _evaluate_closure(closure):
        """torch's ``step(closure)`` contract: call the closure with grad enabled (steps run under no_grad, and
        the closure must record a graph to backward through) and hand back its result."""
        if closure is None:
            return None
        if not callable(closure):
            raise TypeError(f"step: closure must be a callable that recomputes the loss, got "
                            f"{type(closure).__name__}\nHINT: def closure(): opt.zero_grad(); loss = f(); "
                            "loss.backward(); return loss")
        with enable_grad():
            return closure()

    def _workspace(self, device, dtype, rows, length, worker=0):
        """A (rows, length) scratch array on ``device`` (where the update runs) in ``dtype``, kept across steps (one
        per host thread working on a parameter's pieces)."""
        key = (device, dtype, worker)
        ws = self._workspaces.get(key)
        if ws is None or ws.shape[0] < rows or ws.shape[1] < length:
            old_rows, old_length = ws.shape if ws is not None else (0, 0)
            with device.context():
                ws = device.array_module().empty((max(rows, old_rows), max(length, old_length)), key[1])
            self._workspaces[key] = ws
        return ws

    def _update_pieces(self, device, arrays, scratch_rows, update):
        """Call ``update(pieces)`` on matching pieces of ``arrays`` (one shape, on ``device``: the parameter's, its
        gradient's and its state's, or a chunk of each) followed by ``scratch_rows`` scratch pieces, covering them;
        see the module docstring. On CPU devices a large parameter's pieces are shared among the host threads
        (host_threads.py), each in its own span of the arrays with its own scratch rows."""
        size, shape, dtype = arrays[0].size, arrays[0].shape, arrays[0].dtype
        if not size:
            return
        if not all(a.flags.c_contiguous for a in arrays):  # a broadcast gradient, a transposed parameter
            ws = self._workspace(device, dtype, scratch_rows, size)
            update(list(arrays) + [ws[i, :size].reshape(shape) for i in range(scratch_rows)])
            return
        flat = [a.reshape(-1) for a in arrays]
        if device.type == "cpu":
            spans = host_threads.spans(size, THREADED_CPU_CHUNK, THREADED_CPU_CHUNK)
            chunk = min(size, CPU_CHUNK if len(spans) == 1 else THREADED_CPU_CHUNK)
        else:  # on GPUs a parameter is one piece
            spans, chunk = [(0, size)], size

        def run_span(worker, start, stop):
            ws = self._workspace(device, dtype, scratch_rows, chunk, worker)
            for begin in range(start, stop, chunk):
                end = min(begin + chunk, stop)
                update([a[begin:end] for a in flat] + [ws[i, :end - begin] for i in range(scratch_rows)])

        host_threads.run([functools.partial(run_span, worker, start, stop)
                          for worker, (start, stop) in enumerate(spans)])

    # ------------------------------------------------------------------------------- state dict
    def state_dict(self):
        """torch's layout: ``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``; indices
        number the parameters across groups in order. Array state comes as Tensors on the parameter's device
        holding copies (a snapshot: later steps do not change it); ``step`` is an int. The state of a parameter
        fully_shard keeps sharded is this rank's shard of it with its placement (a ShardedTensor)."""
        index = numbering(self.param_groups)
        groups = packed_groups(self.param_groups, index)
        state = {}
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state.get(p)
                if st:
                    state[index[id(p)]] = {k: (_placed(p, self.state_store.copy_out(p, v))
                                               if backend.is_array_like(v) else v)
                                           for k, v in st.items() if not k.startswith("_")}
        return {"state": state, "param_groups": groups}

    @no_grad()
    def load_state_dict(self, state_dict):
        """Restore groups' options and per-parameter state (arrays or Tensors, copied onto each parameter's
        device; floating state takes the parameter's dtype). Parameters are matched by position. A fully_shard
        parameter takes a ShardedTensor of its placement or the whole state (this rank keeps its shard of it)."""
        name = type(self).__name__
        groups = state_dict["param_groups"]
        saved_sizes, own_sizes = group_sizes(groups), group_sizes(self.param_groups)
        if saved_sizes != own_sizes:
            raise ValueError(f"{name}.load_state_dict: the saved param groups hold {saved_sizes} parameters, this "
                             f"optimizer's hold {own_sizes}\nHINT: build the optimizer with the same param groups "
                             "(same model, same grouping) as the one that was saved")
        by_index = paired(groups, self.param_groups)
        new_state = {}
        for i, st in state_dict["state"].items():
            p = by_index.get(int(i))
            if p is None:
                raise ValueError(f"{name}.load_state_dict: state for parameter index {i}, which no group lists")
            new_state[p] = {k: self.keep_state(p, k, v) for k, v in st.items()}
        for saved, group in zip(groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) and isinstance(group.get(k), tuple) else copy.deepcopy(v)
        self.state = new_state

    def keep_state(self, p, key, value):
        """The state entry ``key`` of ``p`` to keep from a loaded ``value`` (an array or Tensor on any device, a whole
        state for a sharded parameter, or a step), restored as ``load_state_dict`` restores it and handed to the state
        store (an array the store already keeps is kept as it is)."""
        if self.state_store.holds(value):
            return value
        value = _restore(value, p, key, type(self).__name__)
        if backend.is_array_like(value) and value.ndim:
            return self.state_store.keep(p, key, value)
        return value

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params")
        return "\n".join(lines) + "\n)"


def _placed(p, array):
    """A state dict's Tensor of ``array`` (a copy on ``p``'s device): a shard's with its placement."""
    copied = Tensor._make(array, p.device)
    return p.placed(copied) if isinstance(p, ShardView) else copied


def _restore(value, param, key, opt_name):
    if isinstance(param, ShardView) and key != "step" and (isinstance(value, ShardedTensor) or (
            backend.is_array_like(value) and value.ndim and tuple(value.shape) == param.whole_shape)):
        value = param.local_of(value, f"{opt_name}.load_state_dict: state {key!r}")
    elif isinstance(value, ShardedTensor):
        raise ValueError(f"{opt_name}.load_state_dict: state {key!r} is a shard ({value!r}) but its parameter is "
                         f"not sharded\nHINT: gather it with full_tensor(), or load with "
                         "it.distributed.checkpoint.set_optimizer_state_dict")
    value = array_of(value)
    if not backend.is_array_like(value):
        return value
    if key == "step":  # torch keeps the step as a 0-d tensor; ours is an int
        return int(backend.to_device_array(value, backend.CPU).item())
    if value.shape != param.array.shape and value.ndim:
        raise ValueError(f"{opt_name}.load_state_dict: state {key!r} has shape {tuple(value.shape)} but its "
                         f"parameter has shape {tuple(param.shape)}")
    dtype = param.array.dtype if value.dtype.kind == "f" else value.dtype
    with param.device.context():
        return backend.to_device_array(value, param.device).astype(dtype, copy=True)
