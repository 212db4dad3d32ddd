"""DDP communication hooks: ``ddp.register_comm_hook(state, hook)`` with ``hook(state, bucket) -> Future`` whose value
is the bucket's reduced flat gradient (default_hooks: allreduce_hook, fp16_compress_hook, bf16_compress_hook)."""
from . import default_hooks
from .grad_bucket import GradBucket

__all__ = ["default_hooks", "GradBucket"]
