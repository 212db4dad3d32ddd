"""DistributedDataParallel's reducer for a ZeroRedundancyOptimizer: buckets are contiguous ranges of the
optimizer's flat gradient space, reduced while backward goes on.

- ZeRO-1 (``shard_gradients=False``): every parameter's gradient is a view into the flat gradient buffer, so a
  finished bucket is all-reduced (averaged) in place there: no bucket copy, no second gradient buffer.
  ``no_sync()`` skips the reduction and gradients accumulate in place, as with plain DDP.
- ZeRO-2 (``shard_gradients=True``): each gradient is copied into its bucket as it arrives and dropped; a full
  bucket is reduced (summed) only to the ranks owning its elements, one ``reduce`` per owner (MPI and NCCL both
  offer it). As soon as a bucket's reduces complete the owner adds its averaged segment to the optimizer's
  gradient shard and the bucket's buffer is released. Every backward pass reduces, inside ``no_sync()`` too:
  accumulating locally would keep the whole gradients ZeRO-2 exists to shed.
"""
from __future__ import annotations

from ...autograd import engine
from ...autograd.grad_mode import no_grad
from ...tensor import Tensor


class _FlatBucket:
    def __init__(self, space, params):
        self.space = space
        self.params = params  # consecutive in the flat space, in reverse order
        positions = [space.position[id(p)] for p in params]
        self.start = min(space.offsets[k] for k in positions)
        self.stop = max(space.offsets[k] + space.params[k].numel() for k in positions)
        self.local = {id(p): space.offsets[k] - self.start for p, k in zip(params, positions)}
        self.buffer = None  # ZeRO-2 only: the bucket's gradients until its reduces complete
        self.pending = len(params)
        self.ready = set()
        self.works = []

    def view(self, p):
        if self.buffer is None:
            xp = self.space.device.array_module()
            with self.space.device.context():
                self.buffer = xp.zeros(self.stop - self.start, self.space.dtype)
        off = self.local[id(p)]
        return self.buffer[off:off + p.numel()].reshape(p.shape)


class ZeroReducer:
    """Reduces gradients for ``zero_optimizer`` (for ``params`` only, when given: the parameters of one pipeline
    chunk among those the optimizer updates); the interface DistributedDataParallel drives."""

    def __init__(self, zero_optimizer, process_group, shard_gradients, bucket_cap_mb=25, first_bucket_mb=1,
                 find_unused_parameters=False, params=None):
        self.zero = zero_optimizer
        self.group = process_group
        self.shard = shard_gradients
        self.find_unused = find_unused_parameters
        mine = None if params is None else {id(p) for p in params}  # a part of the optimizer's (a pipeline chunk's)
        self.buckets = []
        for space in zero_optimizer.spaces:
            current, size, start, limit = [], 0, None, first_bucket_mb * 2 ** 20
            for k in reversed(range(len(space.params))):
                p = space.params[k]
                if mine is not None and id(p) not in mine:
                    continue
                nbytes = p.numel() * p.dtype.itemsize
                adjacent = start == space.offsets[k] + p.numel()  # a bucket is one range of the flat space
                if current and (size + nbytes > limit or not adjacent):
                    self.buckets.append(_FlatBucket(space, current))
                    current, size, limit = [], 0, bucket_cap_mb * 2 ** 20
                current.append(p)
                size += nbytes
                start = space.offsets[k]
            if current:
                self.buckets.append(_FlatBucket(space, current))
        self.where = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket.params}
        self.params = [p for bucket in self.buckets for p in bucket.params]
        self.sync = True
        self._in_pass = False
        self.handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.params]
        if shard_gradients:  # (the spaces of parameters DDP ignores keep their whole gradients)
            zero_optimizer.use_sharded_gradients(list({id(b.space): b.space for b in self.buckets}.values()))

    def prepare_for_backward(self):
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.ready = set()
            bucket.works = []
        self.next_to_launch = 0
        self.next_to_fold = 0
        self._in_pass = False

    def _on_grad_ready(self, param):
        if not (self.sync or self.shard):
            return
        if not self._in_pass:
            self._in_pass = True
            engine.queue_callback(self._finalize)
        bucket = self.buckets[self.where[id(param)]]
        if id(param) in bucket.ready:
            raise RuntimeError("DistributedDataParallel: a parameter received its gradient twice in one backward "
                               "pass\nHINT: reentrant backward or a parameter used in two graphs is not supported")
        if self.shard:
            bucket.view(param)[...] = param.grad.array
            param.grad = None  # ZeRO-2 keeps no whole gradient
        bucket.ready.add(id(param))
        bucket.pending -= 1
        self._launch_ready()
        self._fold_completed(wait=False)

    def _launch_ready(self):
        while self.next_to_launch < len(self.buckets) and self.buckets[self.next_to_launch].pending == 0:
            bucket = self.buckets[self.next_to_launch]
            space = bucket.space
            if self.shard:
                bucket.view(bucket.params[0])  # allocated even when every gradient was missing
                for owner, a, b in space.owner_segments(bucket.start, bucket.stop):
                    segment = Tensor._make(bucket.buffer[a - bucket.start:b - bucket.start], space.device)
                    bucket.works.append((owner, a, segment, self.group.reduce(segment, dst=owner, async_op=True)))
            else:
                grads = Tensor._make(space.flat_grad[bucket.start:bucket.stop], space.device)
                bucket.works.append((None, bucket.start, grads, self.group.all_reduce(grads, "avg", async_op=True)))
            self.next_to_launch += 1

    def _fold_completed(self, wait):
        """ZeRO-2: add each finished bucket's own segment to the gradient shard and free the bucket; ZeRO-1:
        wait for the in-place all-reduces (``wait``), or just drive their progress."""
        while self.next_to_fold < self.next_to_launch:
            bucket = self.buckets[self.next_to_fold]
            if not wait and not all(work.is_completed() for *_, work in bucket.works):
                return
            for owner, start, segment, work in bucket.works:
                work.wait()
                if owner == self.group.rank:
                    self.zero.accumulate_shard(bucket.space, start, segment.array / self.group.size)
            bucket.works = []
            bucket.buffer = None
            self.next_to_fold += 1

    def _finalize(self):
        self._in_pass = False
        missing = [(bucket, p) for bucket in self.buckets for p in bucket.params if id(p) not in bucket.ready]
        if missing and not self.find_unused:
            raise RuntimeError(
                f"DistributedDataParallel: {len(missing)} parameter(s) received no gradient in this backward pass "
                f"(shapes {[tuple(p.shape) for _, p in missing[:5]]}).\nHINT: construct DistributedDataParallel "
                "with find_unused_parameters=True if some parameters are legitimately unused in forward")
        for bucket, p in missing:
            if self.shard:
                bucket.view(p)[...] = 0
            bucket.pending -= 1
        self._launch_ready()
        with no_grad():
            self._fold_completed(wait=True)
        if not self.shard:
            for p in self.params:
                p.grad._version[0] += 1

    def remove(self):
        for h in self.handles:
            h.remove()


__all__ = ["ZeroReducer"]
