"""LoRA adapters (Hu et al., 2021) in PEFT's formulation, whose files PEFT reads and writes.

A wrapped linear layer computes ``base(x) + B(A(dropout(x))) * alpha / r`` with A (r, in) drawn like nn.Linear's
weight (kaiming-uniform, a=sqrt(5)) and B (out, r) zero, so a fresh adapter changes nothing. The base weight and
bias are frozen. Submodules are named as PEFT names them for one adapter (``<layer>.base_layer.weight``,
``<layer>.lora_A.weight``, ``<layer>.lora_B.weight``), so PEFT's file keys are these with ``base_model.model.``
in front (lora_peft.py).

The tensor-parallel linears get their own wrappers (split the way Megatron / NeMo split them), which nn.parallel
registers here when imported (register_lora_wrapper; nn/parallel/tensor_parallel_lora.py): apply_lora and lora_layer
find a layer's wrapper by its class, so this module never imports nn.parallel.
"""
from __future__ import annotations

import difflib
import math
import re
import warnings

from ..autograd.grad_mode import no_grad
from . import functional as F
from .layers import Dropout, Identity, Linear
from .lora_peft import (PEFT_PREFIX, LoRAError, LoRASettings, adapter_config, from_peft_keys, read_adapter_config,
                        read_adapter_weights, to_peft_keys, write_adapter_files)
from .module import Module

ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear layer but the output layer
OUTPUT_LAYER = "lm_head"


# ------------------------------------------------------------------------------------------------ layers
class LoRALinear(Module):
    """``base(x) + lora_B(lora_A(lora_dropout(x))) * scaling`` around an nn.Linear ``base`` (frozen here)."""

    group = None  # the tensor-parallel group the adapter is split over (the parallel subclasses)

    def __init__(self, base, rank, alpha, dropout=0.0, use_rslora=False):
        super().__init__()
        rank = int(rank)
        if rank <= 0:
            raise LoRAError(f"LoRA: expected a positive rank, got {rank}\nHINT: typical ranks are 4 to 64")
        if not 0.0 <= dropout < 1.0:
            raise LoRAError(f"LoRA: expected dropout in [0, 1), got {dropout!r}")
        if _wrapper_class(base) is not type(self):
            raise LoRAError(f"{type(self).__name__}: expected {_BASES.get(type(self), 'a linear layer')}, got "
                            f"{type(base).__name__}\nHINT: lora_layer(base, rank, alpha) picks the wrapper for a "
                            "layer; a layer is wrapped once")
        self.r, self.lora_alpha, self.use_rslora = rank, alpha, bool(use_rslora)
        self.scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
        self.merged = False
        for p in base.parameters():
            p.requires_grad = False
        self.base_layer = base
        self.lora_dropout = Dropout(dropout) if dropout > 0 else Identity()
        # nn.Linear's own initialisation of A is PEFT's (kaiming-uniform, a=sqrt(5)); B starts at zero
        device, dtype = base.weight.device, base.weight.dtype
        self.lora_A = Linear(base.in_features, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = Linear(rank, base.out_features, bias=False, device=device, dtype=dtype)
        with no_grad():
            self.lora_B.weight.zero_()
        self._split_adapters()

    def _split_adapters(self):
        """The tensor-parallel subclasses replace the whole A and B by this rank's parts."""

    @property
    def in_features(self):
        return self.base_layer.in_features

    @property
    def out_features(self):
        return self.base_layer.out_features

    def whole_shapes(self):
        """{"lora_A.weight": (r, in), "lora_B.weight": (out, r)}: the whole adapter shapes."""
        return {"lora_A.weight": (self.r, self.in_features), "lora_B.weight": (self.out_features, self.r)}

    def forward(self, x):
        y = self.base_layer(x)
        if self.merged:
            return y
        return y + F.linear(F.linear(self.lora_dropout(x), self.lora_A.weight), self.lora_B.weight) * self.scaling

    def whole_weight(self, part):
        """The whole weight of ``part`` ("lora_A" | "lora_B"); a tensor-parallel wrapper gathers its split part over
        its group (a collective: every rank of the group calls it)."""
        return getattr(self, part).weight.detach()

    def load_whole_weight(self, part, weight):
        """Copy the whole ``weight`` into ``part`` ("lora_A" | "lora_B"); a tensor-parallel wrapper keeps this
        rank's part of it."""
        getattr(self, part).load_state_dict({"weight": weight})

    def delta_weight(self):
        """The update ``B @ A * scaling`` in the base weight's layout (this rank's part under tensor parallelism)."""
        return (self.lora_B.weight.detach() @ self.lora_A.weight.detach()) * self.scaling

    @no_grad()
    def merge(self):
        """Fold the adapter into the base weight; forward then runs the base layer alone. Merging a merged layer
        warns and does nothing, as PEFT does."""
        if self.merged:
            warnings.warn("LoRA merge: the adapter is already merged; nothing to do", stacklevel=2)
            return
        self.base_layer.weight.add_(self.delta_weight())
        self.merged = True

    @no_grad()
    def unmerge(self):
        """Take the adapter out of the base weight again (warns and does nothing if it is not merged)."""
        if not self.merged:
            warnings.warn("LoRA unmerge: the adapter is not merged; nothing to do", stacklevel=2)
            return
        self.base_layer.weight.sub_(self.delta_weight())
        self.merged = False

    def extra_repr(self):
        return f"r={self.r}, lora_alpha={self.lora_alpha}, scaling={self.scaling:g}, merged={self.merged}"


_WRAPPERS = {}  # layer class -> its LoRA wrapper class, in registration order (nn.Linear's first)
_BASES = {}  # wrapper class -> the layer it wraps, for messages


def register_lora_wrapper(layer_class, wrapper_class, description):
    """LoRA wraps a ``layer_class`` (or a subclass of it) in ``wrapper_class``; ``description`` ("a
    ColumnParallelLinear") names the layer in messages. nn.Linear's is LoRALinear; nn.parallel registers the
    wrappers of its tensor-parallel layers when imported (nn never imports nn.parallel)."""
    _WRAPPERS[layer_class] = wrapper_class
    _BASES[wrapper_class] = description


def _wrapper_class(module):
    """The LoRA class for ``module``, or None when LoRA does not apply to it."""
    if isinstance(module, LoRALinear):
        return None
    for layer_class, wrapper_class in _WRAPPERS.items():
        if isinstance(module, layer_class):
            return wrapper_class
    return None


register_lora_wrapper(Linear, LoRALinear, "an nn.Linear")


def lora_layer(base, rank, alpha, dropout=0.0, use_rslora=False):
    """The LoRA wrapper of ``base``: an nn.Linear, ColumnParallelLinear or RowParallelLinear."""
    cls = _wrapper_class(base)
    if cls is None:
        raise LoRAError(f"LoRA: expected an nn.Linear, ColumnParallelLinear or RowParallelLinear, got "
                        f"{type(base).__name__}\nHINT: target the linear layers inside it")
    return cls(base, rank, alpha, dropout, use_rslora)


# ---------------------------------------------------------------------------------------- model helpers
def matches_target(name, target_modules):
    """PEFT's rule: a regex string must match the whole name; a name in a list matches itself or a suffix after
    a dot ("c_attn" matches "transformer.h.0.attn.c_attn")."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return name in target_modules or any(name.endswith("." + t) for t in target_modules)


def named_lora_layers(model):
    """(dotted name, LoRA layer) of every adapter in ``model``, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]


def _linear_names(model):
    return [name for name, m in model.named_modules() if name and _wrapper_class(m) is not None]


def _resolve_targets(model, target_modules):
    if target_modules == ALL_LINEAR:  # as PEFT, saved as the leaf names it stands for
        return sorted({n.rsplit(".", 1)[-1] for n in _linear_names(model)} - {OUTPUT_LAYER})
    if isinstance(target_modules, str):
        try:
            re.compile(target_modules)
        except re.error as exc:
            raise LoRAError(f"apply_lora: target_modules {target_modules!r} is not a valid regex ({exc})\n"
                            "HINT: pass a list of module names for suffix matching") from exc
        return target_modules
    targets = list(target_modules) if isinstance(target_modules, (list, tuple, set, frozenset)) else []
    if not targets or not all(isinstance(t, str) for t in targets):
        raise LoRAError(f"apply_lora: expected target_modules as a non-empty list of module names or a regex "
                        f"string, got {target_modules!r}\nHINT: e.g. ['c_attn', 'c_proj', 'c_fc']")
    return sorted(set(targets))


def apply_lora(model, rank, alpha, dropout=0.0, target_modules=ALL_LINEAR, use_rslora=False, exclude_modules=None):
    """Wrap every linear layer of ``model`` whose name matches ``target_modules`` (PEFT's rule, see
    ``matches_target``; "all-linear": all but the output layer) in a LoRA adapter, in place, and freeze every
    other parameter. Returns the model."""
    if named_lora_layers(model):
        raise LoRAError("apply_lora: the model already has LoRA adapters\nHINT: load weights into them with "
                        "load_adapter / load_lora_state_dict, or build a fresh model")
    targets = _resolve_targets(model, target_modules)
    chosen = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if not name or not matches_target(name, targets):
            continue
        if exclude_modules and matches_target(name, exclude_modules):
            continue
        if _wrapper_class(module) is None:
            raise LoRAError(f"apply_lora: target {name!r} is a {type(module).__name__}; LoRA applies to nn.Linear, "
                            "ColumnParallelLinear and RowParallelLinear\nHINT: name the linear layers inside it")
        chosen[name] = module
    if not chosen:
        raise LoRAError(_no_match_message(model, targets))
    _warn_tied(model, chosen)
    wrappers = {}  # a module reachable under two names gets one wrapper
    for name, module in chosen.items():
        if id(module) not in wrappers:
            wrappers[id(module)] = lora_layer(module, rank, alpha, dropout, use_rslora)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, wrappers[id(module)])
    mark_only_lora_as_trainable(model)
    model.lora_settings = LoRASettings(int(rank), alpha, float(dropout), targets, bool(use_rslora), exclude_modules)
    return model


def _warn_tied(model, chosen):
    owners = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    tied = sorted({n for module in chosen.values() for p in module.parameters(recurse=False)
                   for n in owners[id(p)] if len(owners[id(p)]) > 1})
    if tied:
        warnings.warn(f"apply_lora: the targets hold weights tied to other parameters ({', '.join(tied)}); merging "
                      "the adapter changes every tied copy", stacklevel=3)


def _no_match_message(model, targets):
    names = _linear_names(model)
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    wanted = [targets] if isinstance(targets, str) else targets
    close = sorted({c for t in wanted for c in difflib.get_close_matches(t.rsplit(".", 1)[-1], leaves, n=2)})
    hint = f"did you mean {close}? " if close else ""
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return (f"apply_lora: no linear layer matches target_modules {targets!r}; the model's linear layers are: "
            f"{shown or 'none'}\nHINT: {hint}a target matches a full module name or its last dotted parts "
            f"(leaf names here: {leaves})")


def lora_parameters(model):
    """The adapter parameters (every layer's A then B), in module order: what the optimizer should train."""
    return [p for _, layer in named_lora_layers(model) for p in (layer.lora_A.weight, layer.lora_B.weight)]


def mark_only_lora_as_trainable(model):
    """requires_grad on the adapter parameters only."""
    for p in model.parameters():
        p.requires_grad = False
    for p in lora_parameters(model):
        p.requires_grad = True
    return model


def lora_state_dict(model, whole=False):
    """{``<layer>.lora_A.weight`` / ``<layer>.lora_B.weight``: tensor}, the model's state-dict names. ``whole``
    gathers split adapters over their tensor group (a collective: every rank of the group calls it)."""
    out = {}
    for name, layer in named_lora_layers(model):
        for part in ("lora_A", "lora_B"):
            value = layer.whole_weight(part) if whole else getattr(layer, part).weight.detach()
            out[_join(name, f"{part}.weight")] = value
    return out


def load_lora_state_dict(model, state):
    """Copy whole adapter tensors (``lora_state_dict(model, whole=True)``'s names) into the model's adapters;
    each rank keeps its part. Every adapter must be given, and nothing else."""
    layers = named_lora_layers(model)
    expected = {_join(name, key): (layer, key, shape) for name, layer in layers
                for key, shape in layer.whole_shapes().items()}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [f"{k}: expected {expected[k][2]}, got {tuple(state[k].shape)}" for k in expected
             if k in state and tuple(state[k].shape) != expected[k][2]]
    merged = [name for name, layer in layers if layer.merged]
    if missing or unexpected or wrong or merged:
        raise LoRAError(_mismatch_message(missing, unexpected, wrong, merged))
    for key, (layer, part, _) in expected.items():
        layer.load_whole_weight(part.split(".")[0], state[key])
    return model


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _mismatch_message(missing, unexpected, wrong, merged):
    parts = []
    for what, items in (("missing adapters", missing), ("unexpected entries", unexpected),
                        ("shape mismatches", wrong), ("merged layers (unmerge them first)", merged)):
        if items:
            shown = "; ".join(items[:8]) + (f"; ... ({len(items)} in all)" if len(items) > 8 else "")
            parts.append(f"  {what} ({len(items)}): {shown}")
    return ("load adapter: the adapter does not fit the model's LoRA layers:\n" + "\n".join(parts) +
            "\nHINT: was it trained with the same target_modules and rank, on a model with the same layer names "
            "and sizes?")


def merge_lora(model):
    """Merge every adapter into its base weight (see LoRALinear.merge)."""
    for _, layer in named_lora_layers(model):
        layer.merge()
    return model


def unmerge_lora(model):
    for _, layer in named_lora_layers(model):
        layer.unmerge()
    return model


def merge_and_unload(model):
    """Merge every adapter and put the base layers back in the wrappers' places (their parameters stay frozen):
    the plain model, with PEFT's ``merge_and_unload`` weights."""
    for name, layer in named_lora_layers(model):
        if not layer.merged:
            layer.merge()
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, layer.base_layer)
    if "lora_settings" in vars(model):
        del model.lora_settings
    return model


# ------------------------------------------------------------------------------------------ PEFT files
def lora_settings(model):
    """The model's LoRA settings: what apply_lora recorded, or read off the layers when they were built by hand."""
    layers = named_lora_layers(model)
    if not layers:
        raise LoRAError("save_adapter: the model has no LoRA adapters\nHINT: apply_lora(model, rank, alpha, "
                        "target_modules=...) first")
    recorded = vars(model).get("lora_settings")
    if recorded is not None:
        return recorded
    kinds = {(layer.r, layer.lora_alpha, layer.use_rslora,
              layer.lora_dropout.p if isinstance(layer.lora_dropout, Dropout) else 0.0) for _, layer in layers}
    if len(kinds) > 1:
        raise LoRAError(f"save_adapter: expected one rank, alpha and dropout for every adapter, got {sorted(kinds)}"
                        "\nHINT: PEFT's config holds one of each; use the same for every layer")
    r, alpha, rslora, p = kinds.pop()
    return LoRASettings(r, alpha, p, sorted({name.rsplit(".", 1)[-1] for name, _ in layers}), rslora)


def save_adapter(model, directory, base_model_name_or_path=None, config_extra=None):
    """Write PEFT's adapter files into ``directory``: adapter_config.json (LoraConfig) and adapter_model.safetensors
    (whole adapters under ``base_model.model.<layer>.lora_A.weight`` ...), each atomically. Under tensor
    parallelism every rank of the group calls it (the adapters are gathered) and the group's rank 0 writes; a
    model without tensor parallelism is written by whoever calls it. Returns the directory where written, None on
    the other ranks."""
    settings = lora_settings(model)
    state = lora_state_dict(model, whole=True)
    if any(layer.group is not None and layer.group.rank != 0 for _, layer in named_lora_layers(model)):
        return None
    config = adapter_config(settings, _fan_in_fan_out(model), base_model_name_or_path, config_extra)
    write_adapter_files(directory, config, to_peft_keys(state))
    return directory


def load_adapter(model, directory):
    """Read PEFT's adapter files: wrap the layers the config targets (unless the model has adapters already) and
    load the weights, each rank keeping its part under tensor parallelism. Returns the model."""
    settings = read_adapter_config(directory)
    state = from_peft_keys(read_adapter_weights(directory), directory)
    layers = named_lora_layers(model)
    if not layers:
        apply_lora(model, settings.r, settings.lora_alpha, settings.lora_dropout, settings.target_modules,
                   settings.use_rslora, settings.exclude_modules)
    else:
        found = {(layer.r, layer.lora_alpha, layer.use_rslora) for _, layer in layers}
        want = (settings.r, settings.lora_alpha, settings.use_rslora)
        if found != {want}:
            raise LoRAError(f"load_adapter: {directory} has r, lora_alpha, use_rslora = {want}; the model's adapters "
                            f"have {sorted(found)}\nHINT: load it into a model without adapters, which wraps its "
                            "layers as the file says")
    return load_lora_state_dict(model, state)


def _fan_in_fan_out(model):
    """PEFT's flag for Conv1D targets: a model whose Hugging Face checkpoint stores some projections (in, out)
    names their weights' suffixes in ``hf_conv1d_weights`` (GPT-2 does), and PEFT sets the flag when an adapter
    wraps one of them."""
    conv1d = tuple(getattr(model, "hf_conv1d_weights", ()))
    return bool(conv1d) and any((name + ".weight").endswith(conv1d) for name, _ in named_lora_layers(model))


__all__ = ["LoRAError", "LoRASettings", "LoRALinear", "register_lora_wrapper", "lora_layer", "apply_lora",
           "matches_target", "named_lora_layers", "lora_parameters", "mark_only_lora_as_trainable", "lora_state_dict",
           "load_lora_state_dict", "merge_lora", "unmerge_lora", "merge_and_unload", "lora_settings", "save_adapter",
           "load_adapter", "PEFT_PREFIX"]
