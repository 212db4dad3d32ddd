"""DistributedDataParallel: one process per rank, gradients averaged by bucketed all-reduces that overlap
backward.

The Reducer groups parameters into buckets in reverse registration order (roughly the order backward
produces their gradients): the first bucket holds up to 1 MB, the others up to ``bucket_cap_mb``, as
PyTorch does. A post-accumulate hook on each parameter's AccumulateGrad copies the gradient into its
bucket's flat buffer; when a bucket is full its asynchronous all-reduce starts at once (buckets are
launched in order, so every rank issues the collectives in the same order) while backward goes on. At
the end of the pass (an engine callback) the reducer launches what is left, waits, and writes the
averaged gradients back into ``param.grad``.
"""
from __future__ import annotations

import contextlib

from ...autograd import engine
from ...autograd.grad_mode import is_grad_enabled, no_grad
from ...tensor import Tensor
from ..module import Module


class _Bucket:
    def __init__(self, params, dtype, device):
        self.params = params
        self.offsets = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += p.numel()
        xp = device.array_module()
        with device.context():
            self.flat = Tensor._make(xp.zeros(total, dtype=dtype), device)
        self.pending = len(params)
        self.ready = set()
        self.work = None

    def view(self, i):
        p = self.params[i]
        off = self.offsets[i]
        return self.flat.array[off:off + p.numel()].reshape(p.shape)


class Reducer:
    def __init__(self, params, process_group, bucket_cap_mb=25, first_bucket_mb=1, find_unused_parameters=False):
        self.group = process_group
        self.find_unused = find_unused_parameters
        self.params = params
        self.buckets = self._build_buckets(params, bucket_cap_mb * 2 ** 20, first_bucket_mb * 2 ** 20)
        self.where = {}
        for b, bucket in enumerate(self.buckets):
            for i, p in enumerate(bucket.params):
                self.where[id(p)] = (b, i)
        self.sync = True
        self._in_pass = False
        self.hook = self.hook_state = None  # a communication hook (register_comm_hook)
        self.passes = 0  # backward passes that reduced
        self.active_ranks = None  # under join(divide_by_initial_world_size=False): the ranks still training
        self.handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    @staticmethod
    def _build_buckets(params, cap, first_cap):
        buckets, current, size, limit = [], [], 0, first_cap
        for p in reversed(params):
            nbytes = p.numel() * p.dtype.itemsize
            if current and (size + nbytes > limit or p.dtype != current[0].dtype or p.device is not current[0].device):
                buckets.append(current)
                current, size, limit = [], 0, cap
            current.append(p)
            size += nbytes
        if current:
            buckets.append(current)
        return [_Bucket(ps, ps[0].dtype, ps[0].device) for ps in buckets]

    def prepare_for_backward(self):
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.ready = set()
            bucket.work = None
        self.next_to_launch = 0
        self._in_pass = False

    def _on_grad_ready(self, param):
        if not self.sync:
            return
        if not self._in_pass:
            self._in_pass = True
            engine.queue_callback(self._finalize)
        b, i = self.where[id(param)]
        bucket = self.buckets[b]
        if i in bucket.ready:
            raise RuntimeError("DistributedDataParallel: a parameter received its gradient twice in one backward "
                               "pass\nHINT: reentrant backward or a parameter used in two graphs is not supported")
        bucket.view(i)[...] = param.grad.array
        bucket.ready.add(i)
        bucket.pending -= 1
        self._launch_ready()
        for bk in self.buckets[:self.next_to_launch]:
            _poll(bk.work)  # drive MPI progress so communication overlaps backward

    def _launch_ready(self):
        while self.next_to_launch < len(self.buckets) and self.buckets[self.next_to_launch].pending == 0:
            self._launch(self.next_to_launch)
            self.next_to_launch += 1

    def _launch(self, b):
        bucket = self.buckets[b]
        if self.hook is not None:
            from ...distributed.algorithms.ddp_comm_hooks.grad_bucket import GradBucket

            grad_bucket = GradBucket(b, bucket.flat, bucket.params, bucket.offsets, b == len(self.buckets) - 1)
            bucket.work = self.hook(self.hook_state, grad_bucket)
            if not hasattr(bucket.work, "wait"):
                raise TypeError(f"DistributedDataParallel: the communication hook returned "
                                f"{type(bucket.work).__name__}, expected a future (with wait() giving the reduced "
                                "flat gradient)\nHINT: return dist.all_reduce(..., async_op=True) wrapped as "
                                "it.distributed.futures.Future(work, value=tensor)")
        else:
            op = "avg" if self.active_ranks is None else "sum"
            bucket.work = self.group.all_reduce(bucket.flat, op, async_op=True)

    def _reduced(self, bucket):
        """Wait for a bucket's reduction; its flat buffer then holds the averaged gradients."""
        result = bucket.work.wait()
        if self.hook is not None:
            if isinstance(result, (list, tuple)) and len(result) == 1:  # torch hooks' fut.value()[0] shape
                result = result[0]
            if not isinstance(result, Tensor) or result.numel() != bucket.flat.numel():
                raise TypeError(f"DistributedDataParallel: the communication hook's future gave "
                                f"{type(result).__name__}, expected a Tensor of the bucket's {bucket.flat.numel()} "
                                "elements\nHINT: the future's value is the reduced bucket.buffer()")
            if result.array is not bucket.flat.array:
                bucket.flat.array[...] = result.array.reshape(-1)
        elif self.active_ranks is not None:
            bucket.flat.array[...] /= self.active_ranks

    def _finalize(self):
        self._in_pass = False
        missing = [(b, i) for b, bucket in enumerate(self.buckets) for i in range(len(bucket.params))
                   if i not in bucket.ready]
        if missing and not self.find_unused:
            position = {id(p): k for k, p in enumerate(self.params)}
            names = ", ".join(f"#{position[id(self.buckets[b].params[i])]} shape "
                              f"{tuple(self.buckets[b].params[i].shape)}" for b, i in missing[:5])
            raise RuntimeError(
                f"DistributedDataParallel: {len(missing)} parameter(s) received no gradient in this backward pass "
                f"(parameter index in module.parameters(): {names}).\nHINT: construct DistributedDataParallel with "
                "find_unused_parameters=True if some parameters are legitimately unused in forward")
        for b, i in missing:  # (gradients accumulated under no_sync count: torch's rule)
            grad = self.buckets[b].params[i].grad
            self.buckets[b].view(i)[...] = 0 if grad is None else grad.array
            self.buckets[b].pending -= 1
        self._launch_ready()
        self.passes += 1
        unused = self._globally_unused(missing) if self.find_unused else set()
        with no_grad():
            for b, bucket in enumerate(self.buckets):
                self._reduced(bucket)
                for i, p in enumerate(bucket.params):
                    if (b, i) in unused:  # no rank had a gradient: it stays None, as in one process
                        continue
                    averaged = bucket.view(i)
                    if p.grad is None:
                        p.grad = Tensor._make(averaged.copy(), p.device)
                    else:
                        p.grad.array[...] = averaged
                        p.grad._version[0] += 1

    def _globally_unused(self, missing):
        """(bucket, index) of the parameters that got no gradient on any rank (one all-reduce of a usage map, only
        with find_unused_parameters, as torch's reducer does)."""
        from ...distributed.grad_hooks import globally_unused

        pairs = [(b, i) for b, bucket in enumerate(self.buckets) for i in range(len(bucket.params))]
        local = set(m for m in missing if self.buckets[m[0]].params[m[1]].grad is None)
        return {pairs[k] for k in globally_unused([pair not in local for pair in pairs], self.group)}

    def shadow_backward(self):
        """A rank that ran out of data (DDP.join) matches the training ranks' backward: the same reductions, bucket by
        bucket, of zero gradients (and the unused-parameter agreement, where it runs), results dropped."""
        from ...distributed.grad_hooks import globally_unused

        for b, bucket in enumerate(self.buckets):
            bucket.flat.array[...] = 0
            self._launch(b)
        if self.find_unused:
            globally_unused([False] * sum(len(bk.params) for bk in self.buckets), self.group)
        for bucket in self.buckets:
            bucket.work.wait()

    def remove(self):
        for h in self.handles:
            h.remove()


def _poll(work):
    done = getattr(work, "is_completed", None) or getattr(work, "done", None)
    if done is not None:
        done()


class DistributedDataParallel(Module):
    """Wrap a module for data-parallel training across the ranks of ``process_group`` (default: world).

    Construction broadcasts parameters and buffers from rank 0; each backward averages gradients across
    ranks. Use ``no_sync()`` for the micro-steps of gradient accumulation.

    ``zero_optimizer`` (a ZeroRedundancyOptimizer over this module's parameters) with ``zero_stage``: 1 all-reduces
    the gradients in place in the optimizer's flat gradient buffer (no bucket copies); 2 reduces each bucket only to
    the ranks owning its elements, which keep just their gradient shard (see zero_reducer.py).
    ``ignored_parameters`` are neither broadcast nor reduced (an expert-parallel run's local experts, which the
    caller reduces over their own group; under a zero_optimizer they keep their whole gradients).

    ``state_dict()`` / ``load_state_dict()`` are Module's: the keys carry the wrapped module's attribute name
    (``module.``), as torch's do; ``ddp.module.state_dict()`` gives the plain model's keys.
    """

    def __init__(self, module, process_group=None, bucket_cap_mb=25, find_unused_parameters=False,
                 broadcast_buffers=True, first_bucket_mb=1, zero_optimizer=None, zero_stage=2,
                 ignored_parameters=()):
        super().__init__()
        from ...distributed import default_group

        self.module = module
        self.process_group = process_group or default_group()
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        ignored = {id(p) for p in ignored_parameters}
        params = [p for p in module.parameters() if p.requires_grad and id(p) not in ignored]
        with no_grad():
            for t in [p for p in module.parameters() if id(p) not in ignored] + list(module.buffers()):
                self.process_group.broadcast(t, 0)
        if zero_optimizer is not None:
            if not {id(p) for p in params} <= {id(p) for p in zero_optimizer.params}:
                raise ValueError("DistributedDataParallel: zero_optimizer must optimize every parameter of this module "
                                 "that requires grad\nHINT: build it from module.parameters() (or their param "
                                 "groups, or a model's holding this module) before wrapping")
            if zero_stage not in (1, 2):
                raise ValueError(f"DistributedDataParallel: expected zero_stage 1 or 2 with a zero_optimizer, got "
                                 f"{zero_stage!r}\nHINT: stage 3 (sharded parameters) is not supported")
            from .zero_reducer import ZeroReducer
            self.reducer = ZeroReducer(zero_optimizer, self.process_group, zero_stage == 2, bucket_cap_mb,
                                       first_bucket_mb, find_unused_parameters, params)
        else:
            self.reducer = Reducer(params, self.process_group, bucket_cap_mb, first_bucket_mb,
                                   find_unused_parameters)
        self.require_sync = True
        self._join_config = None  # inside join(): its options

    def forward(self, *args, **kwargs):
        if self._join_config is not None:
            from .ddp_join import notify

            notify(self)
        if self.broadcast_buffers:
            with no_grad():
                for b in self.module.buffers():
                    self.process_group.broadcast(b, 0)
        if is_grad_enabled():
            self.reducer.sync = self.require_sync
            self.reducer.prepare_for_backward()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally; the next synced backward averages them."""
        prev = self.require_sync
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = prev

    def prepare_backward(self, sync):
        """Make the next backward pass average the gradients (``sync``) or accumulate them locally, whatever the
        forward's ``no_sync`` state was: for pipeline schedules, whose backwards do not follow their forwards, so
        that only a chunk's last backward of a step reduces (while it runs, overlapping the rest of the schedule)."""
        self.reducer.sync = bool(sync)
        self.reducer.prepare_for_backward()

    def register_comm_hook(self, state, hook):
        """Reduce each gradient bucket with ``hook(state, bucket) -> future`` instead of the built-in average (torch's
        API: bucket is a GradBucket, the future's ``wait()`` gives the reduced flat gradient; built-in hooks in
        it.distributed.algorithms.ddp_comm_hooks.default_hooks). One hook per module, registered before the first
        backward."""
        if not callable(hook):
            raise TypeError(f"register_comm_hook: expected a callable hook(state, bucket), got {type(hook).__name__}")
        if not isinstance(self.reducer, Reducer):
            raise NotImplementedError("register_comm_hook: not supported with a zero_optimizer (its reducer writes "
                                      "into the optimizer's flat gradients)\nHINT: drop zero_optimizer to use a hook")
        if self.reducer.hook is not None:
            raise RuntimeError(f"register_comm_hook can only be called once per DistributedDataParallel module; "
                               f"{getattr(self.reducer.hook, '__name__', 'a hook')} is already registered\nHINT: "
                               "wrap the model again to use another hook")
        if self.reducer.passes:
            raise RuntimeError(f"register_comm_hook must be called before the first backward pass; "
                               f"{self.reducer.passes} have reduced gradients already\nHINT: register the hook right "
                               "after wrapping the model")
        self.reducer.hook, self.reducer.hook_state = hook, state

    def join(self, divide_by_initial_world_size=True, enable=True, throw_on_early_termination=False):
        """Context manager for uneven inputs (torch's DDP.join): a rank that leaves it (out of data) shadows the
        collectives of the ranks still training until all have left; see ddp_join.py."""
        from .ddp_join import join

        return join(self, divide_by_initial_world_size, enable, throw_on_early_termination)

    @property
    def bucket_sizes(self):
        return [[tuple(p.shape) for p in b.params] for b in self.reducer.buckets]


__all__ = ["DistributedDataParallel", "Reducer"]
