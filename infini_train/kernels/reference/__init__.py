"""NumPy references of the registry kernels' exact arithmetic (their tiles, accumulation order and dtypes), run on
the CPU against the array path (tests/kernels) and, on a GPU, against the kernels themselves. Each module's
docstring says what it cannot pin down."""
from . import classifier, flash_attention, gelu_forward, norm_forward

FOR_KERNEL = {  # registry name -> its reference module
    "flash_attention": flash_attention,
    "fused_classifier": classifier,
    "layer_norm_forward": norm_forward,
    "gelu_forward": gelu_forward,
}

__all__ = ["FOR_KERNEL"]
