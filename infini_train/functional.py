"""Top-level tensor functions (it.cat, it.stack, it.matmul, it.where, ...), gathered from the op families."""
from .autograd.elementwise import add, div, exp, log, mul, neg, pow, sub, tanh  # noqa: F401
from .autograd.matmul import matmul  # noqa: F401
from .autograd.reduction import mean, sum  # noqa: F401
from .autograd.transform import reshape, transpose  # noqa: F401
