"""Neural-network modules, functional forms, initialisation and gradient utilities."""
from . import attention, functional, init, utils
from .containers import ModuleDict, ModuleList, Sequential
from .batch_norm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .conv import AvgPool2d, Conv2d, Flatten, MaxPool2d, Unflatten
from .layers import (GELU, Dropout, Embedding, Identity, LayerNorm, Linear, LogSoftmax, ReLU, RMSNorm, SiLU, Sigmoid,
                     Softmax, Tanh)
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss
from .module import Module, Parameter
from .moe import MoE, Router
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from . import lora

__all__ = ["functional", "init", "utils", "Module", "Parameter", "Sequential", "ModuleList", "ModuleDict", "Linear",
           "Embedding", "LayerNorm", "Dropout", "GELU", "ReLU", "Sigmoid", "SiLU", "Tanh", "Softmax", "LogSoftmax",
           "Identity", "CrossEntropyLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss", "RMSNorm", "lora", "Conv2d",
           "MaxPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Flatten", "Unflatten"]
__all__ += ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell", "MoE", "Router"]


def __getattr__(name):
    """``it.nn.parallel`` on first use (it joins the distributed layer, which plain nn code does not need)."""
    if name == "parallel":
        import importlib

        return importlib.import_module(".parallel", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
