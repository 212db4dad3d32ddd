"""infini_train: a distributed deep-learning training runtime on NumPy (CPU) and CuPy (GPU)."""
from . import host_threads  # first: it sets OpenBLAS's spin time before numpy loads it
from . import backend
from .autograd.grad_mode import (enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
                                  set_grad_enabled)
from .backend import (
    Device,
    bfloat16,
    bool_,
    device,
    device_count,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    manual_seed,
    set_default_dtype,
    uint8,
    uint16,
)
from .memory_format import channels_last, contiguous_format, memory_format, preserve_format
from .host_threads import get_num_threads, set_num_threads  # host threads, as torch.set_num_threads
from .tensor import Tensor
from .generator import Generator  # it.Generator: a random stream of its own, as torch.Generator
from .creation import (
    arange,
    empty,
    empty_like,
    from_numpy,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    randn_like,
    randperm,
    tensor,
    zeros,
    zeros_like,
)
from . import autograd, return_types
from .autograd.autocast import autocast, get_autocast_dtype, is_autocast_enabled
from .lazy_mode import is_lazy_enabled, lazy  # it.lazy: the context manager
from . import amp
from . import distributed, linalg, nn, optim  # it.distributed, it.linalg, it.nn, it.optim
from . import profiler  # it.profiler.profile, record_function
from . import utils  # it.utils.checkpoint (activation recomputation)
from . import models  # it.models.from_pretrained (the model modules import when asked for)
from .serialization import load, save
from .functional import *  # noqa: F401,F403  (it.cat, it.matmul, it.exp, ...)

bool = bool_  # noqa: A001 - it.bool, as in the contract
__version__ = "0.1.0"
