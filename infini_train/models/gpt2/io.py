"""GPT-2 weights interop: Hugging Face (config.json + model.safetensors) and llm.c's .bin model files.

HF stores the four attention/MLP projection matrices as Conv1D, i.e. (in, out): they are transposed to
nn.Linear's (out, in) on load and back on save. llm.c's file is a 256 x int32 header followed by the
parameters in a fixed order, the token embedding padded to a multiple of 128 rows.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ...atomic_file import write_atomically
from ...progress import progress
from ..special_tokens import text_boundary_ids
from .config import GPT2Config

HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in old checkpoints
LLMC_MAGIC = 20240326
LLMC_VERSIONS = {3: "float32", 5: "bfloat16"}


class WeightsError(ValueError):
    """A model file that cannot be loaded: names the file, the tensor, what was expected and found."""


def _atomic_write(path, write):
    """``write(f)`` fills a binary file object that becomes ``path`` whole (atomic_file.write_atomically)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def fill(tmp):
        with open(tmp, "wb") as f:
            write(f)

    write_atomically(path, fill)


def load_pretrained(cls, path):
    path = os.fspath(path)
    if os.path.isdir(path):
        return load_hf(cls, path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"GPT2.from_pretrained: no such file or directory: {path}\n"
                                "HINT: pass an HF GPT-2 directory (config.json + model.safetensors) or an llm.c "
                                ".bin model file")
    if path.endswith(".safetensors"):
        return load_hf(cls, os.path.dirname(path) or ".")
    return load_llmc(cls, path)


# ------------------------------------------------------------------------------------------ Hugging Face
def hf_config_to_gpt2(hf: dict, source: str) -> GPT2Config:
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise WeightsError(f"{source}: activation_function {act!r} is not supported (GPT-2 uses the tanh "
                           "approximation, 'gelu_new')")
    n_embd = hf["n_embd"]
    if hf.get("n_inner") not in (None, 4 * n_embd):
        raise WeightsError(f"{source}: n_inner={hf['n_inner']} is not supported (expected 4*n_embd = {4 * n_embd})")
    return GPT2Config(block_size=hf.get("n_positions", hf.get("n_ctx", 1024)), vocab_size=hf["vocab_size"],
                      n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=n_embd,
                      dropout=0.0, bias=True)


def hf_weights(directory):
    """(GPT2Config, {name in this model: MappedArray}) of an HF GPT-2 directory: only the header is read; the
    Conv1D matrices come transposed to (out, in), the output layer is the token embedding."""
    from ...safetensors_io import SafetensorsError, mapped_safetensors

    config_path = os.path.join(directory, "config.json")
    weights_path = os.path.join(directory, "model.safetensors")
    for p in (config_path, weights_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"GPT2.from_pretrained: {p} is missing\nHINT: an HF GPT-2 directory holds "
                                    "config.json and model.safetensors (save_pretrained writes both)")
    with open(config_path) as f:
        config = hf_config_to_gpt2(json.load(f), config_path)
    try:
        tensors = mapped_safetensors(weights_path)
    except (SafetensorsError, OSError, ValueError) as exc:
        raise WeightsError(f"{weights_path}: not a readable safetensors file ({exc})") from exc
    state = {}
    for key, value in tensors.items():
        if key.endswith(HF_IGNORED_SUFFIXES):
            continue
        name = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
        state[name] = value.T if name.endswith(HF_CONV1D) else value
    state.setdefault("lm_head.weight", state.get("transformer.wte.weight"))
    return config, state


def load_hf(cls, directory):
    config, mapped = hf_weights(directory)
    weights_path = os.path.join(directory, "model.safetensors")
    model = cls(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = {}
    for name, value in progress(mapped.items(), total=len(mapped), desc="loading weights", unit="tensor"):
        if value is None:
            continue
        if name not in expected:
            raise WeightsError(f"{weights_path}: unexpected tensor {name!r} (shape {value.shape})")
        if tuple(value.shape) != expected[name]:
            raise WeightsError(f"{weights_path}: tensor {name!r} has shape {tuple(value.shape)}, expected "
                               f"{expected[name]} for config {config}")
        state[name] = np.ascontiguousarray(np.asarray(value), dtype=np.float32)
    missing = [k for k in expected if state.get(k) is None]
    if missing:
        raise WeightsError(f"{weights_path}: missing tensors {missing}")
    model.load_state_dict(state)
    return model


def save_hf(model, directory):
    from safetensors.numpy import save

    cfg = model.config
    bos, eos = text_boundary_ids(cfg.vocab_size)
    hf_config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size, "n_ctx": cfg.block_size,
        "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": None,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "bos_token_id": bos, "eos_token_id": eos,
        "scale_attn_weights": True, "use_cache": True, "tie_word_embeddings": True,
    }
    tensors = {}
    for name, value in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to transformer.wte.weight, as HF writes it
        arr = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
        if name.endswith(HF_CONV1D):
            arr = arr.T
        tensors[name] = np.ascontiguousarray(arr, dtype=np.float32)
    os.makedirs(directory, exist_ok=True)
    blob = save(tensors, metadata={"format": "pt"})
    _atomic_write(os.path.join(directory, "model.safetensors"), lambda f: f.write(blob))
    text = json.dumps(hf_config, indent=2).encode()
    _atomic_write(os.path.join(directory, "config.json"), lambda f: f.write(text))


# ------------------------------------------------------------------------------------------------ llm.c
def _llmc_layout(cfg: GPT2Config, padded_vocab: int):
    """(name, shape) of every tensor in llm.c's file order; per-layer tensors are stacked over layers."""
    L, C, T = cfg.n_layer, cfg.n_embd, cfg.block_size
    return [
        ("wte", (padded_vocab, C)), ("wpe", (T, C)),
        ("ln_1.weight", (L, C)), ("ln_1.bias", (L, C)),
        ("attn.c_attn.weight", (L, 3 * C, C)), ("attn.c_attn.bias", (L, 3 * C)),
        ("attn.c_proj.weight", (L, C, C)), ("attn.c_proj.bias", (L, C)),
        ("ln_2.weight", (L, C)), ("ln_2.bias", (L, C)),
        ("mlp.c_fc.weight", (L, 4 * C, C)), ("mlp.c_fc.bias", (L, 4 * C)),
        ("mlp.c_proj.weight", (L, C, 4 * C)), ("mlp.c_proj.bias", (L, C)),
        ("ln_f.weight", (C,)), ("ln_f.bias", (C,)),
    ]


def load_llmc(cls, path):
    config, mapped = llmc_weights(path)
    model = cls(config)
    model.load_state_dict({name: np.asarray(value).astype(np.float32) for name, value in mapped.items()})
    return model


def llmc_weights(path):
    """(GPT2Config, {name in this model: MappedArray}) of an llm.c model file: the header is checked and read,
    the tensors only located (each layer's a row of llm.c's stacked tensors, the embedding without its padding)."""
    from ...mapped_arrays import MappedArray

    size = os.path.getsize(path)
    if size < 256 * 4:
        raise WeightsError(f"{path}: file has {size} bytes, shorter than llm.c's 1024-byte header\n"
                           "HINT: is this an llm.c model file (gpt2_124M.bin)?")
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != LLMC_MAGIC:
        raise WeightsError(f"{path}: bad magic number {header[0]}, expected {LLMC_MAGIC} (llm.c GPT-2 model)\n"
                           "HINT: token shards (magic 20240520) are data, not models")
    version = int(header[1])
    if version not in LLMC_VERSIONS:
        raise WeightsError(f"{path}: unsupported llm.c model version {version}, expected 3 (float32) or 5 "
                           "(bfloat16)")
    block, vocab, n_layer, n_head, n_embd, padded = (int(x) for x in header[2:8])
    padded = padded or vocab
    config = GPT2Config(block_size=block, vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    if version == 3:
        dtype = np.dtype(np.float32)
    else:
        import ml_dtypes
        dtype = np.dtype(ml_dtypes.bfloat16)
    layout = _llmc_layout(config, padded)
    offset = 256 * 4
    arrays = {}
    for name, shape in layout:
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if offset + nbytes > size:
            raise WeightsError(f"{path}: truncated at tensor {name!r} (needs bytes {offset}..{offset + nbytes}, "
                               f"file has {size})\nHINT: the file was cut off while copying or writing")
        arrays[name] = MappedArray(path, offset, shape, dtype)
        offset += nbytes
    if offset != size:
        raise WeightsError(f"{path}: {size - offset} unexpected trailing bytes after the last tensor\n"
                           f"HINT: the header says {config}; the file may not match it")
    state = {
        "transformer.wte.weight": arrays["wte"].first(vocab), "transformer.wpe.weight": arrays["wpe"],
        "transformer.ln_f.weight": arrays["ln_f.weight"], "transformer.ln_f.bias": arrays["ln_f.bias"],
    }
    for name, _ in layout[2:-2]:
        for layer in range(n_layer):
            state[f"transformer.h.{layer}.{name}"] = arrays[name].row(layer)
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return config, state


def save_llmc(model, path, dtype="float32"):
    cfg = model.config
    if not cfg.bias:
        raise ValueError("save_llmc: llm.c's format stores biases; this model was built with bias=False")
    version = {v: k for k, v in LLMC_VERSIONS.items()}.get(dtype)
    if version is None:
        raise ValueError(f"save_llmc: dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    np_dtype = np.dtype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes
        np_dtype = np.dtype(ml_dtypes.bfloat16)
    padded = ((cfg.vocab_size + 127) // 128) * 128
    state = {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in model.state_dict().items()}
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [LLMC_MAGIC, version, cfg.block_size, cfg.vocab_size, cfg.n_layer, cfg.n_head, cfg.n_embd, padded]
    wte = np.zeros((padded, cfg.n_embd), np.float32)
    wte[:cfg.vocab_size] = state["transformer.wte.weight"]
    chunks = [header.tobytes(), wte.astype(np_dtype).tobytes(),
              state["transformer.wpe.weight"].astype(np_dtype).tobytes()]
    for name, _ in _llmc_layout(cfg, padded)[2:-2]:
        stacked = np.stack([state[f"transformer.h.{i}.{name}"] for i in range(cfg.n_layer)])
        chunks.append(stacked.astype(np_dtype).tobytes())
    chunks.append(state["transformer.ln_f.weight"].astype(np_dtype).tobytes())
    chunks.append(state["transformer.ln_f.bias"].astype(np_dtype).tobytes())

    def write(f):
        for chunk in chunks:
            f.write(chunk)

    _atomic_write(path, write)
