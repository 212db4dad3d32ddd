"""Neural-network modules, functional forms, initialisation and gradient utilities."""
from . import functional, init, utils
from .containers import ModuleDict, ModuleList, Sequential
from .layers import GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear, ReLU, Tanh
from .module import Module, Parameter
