"""Write a sharded run checkpoint (``train.checkpoint_format=sharded``) as one-process files.

    python -m infini_train.tools.consolidate CHECKPOINT OUT                     # a whole-format checkpoint directory
    python -m infini_train.tools.consolidate CHECKPOINT OUT --format hf         # a Hugging Face model directory
    python -m infini_train.tools.consolidate CHECKPOINT OUT.bin --format llmc   # llm.c's model file (GPT-2)

``safetensors`` (the default): OUT becomes a checkpoint directory in the whole format (model.safetensors,
optimizer.safetensors, state.json with fresh hashes) that resume, evaluate.py and generate.py read like any other;
both files are streamed from the shards one tensor at a time, so the tool never holds more than the largest tensor.
``hf`` and ``llmc``: the model is assembled in this process and written by the model's own exporter (transformers
loads the HF directory). CHECKPOINT may be a step directory or a run's out_dir (its newest checkpoint); every shard
is verified against state.json's hashes first. Exit status: 0, or 2 on bad input (the message says why).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from ..distributed.checkpoint import read_metadata
from ..distributed.checkpoint.whole_files import whole_tensor, write_whole_safetensors
from ..models import registry
from ..training import checkpoints as ckpt
from ..training.sharded_checkpoints import is_sharded
from ..training.sharded_state import optimizer_entries, whole_param_groups, whole_state

FORMATS = ("safetensors", "hf", "llmc")


class BadInput(ValueError):
    """A checkpoint or destination the tool cannot use."""


def consolidate(checkpoint, out, fmt="safetensors"):
    """Write the sharded checkpoint ``checkpoint`` to ``out`` in ``fmt``; returns ``out``."""
    if fmt not in FORMATS:
        raise BadInput(f"--format: expected one of {FORMATS}, got {fmt!r}")
    try:
        path = ckpt.resolve_checkpoint(checkpoint)
        state = ckpt.verify_checkpoint(path)
    except ckpt.CheckpointError as exc:
        raise BadInput(str(exc)) from None
    if not is_sharded(state):
        raise BadInput(f"{path} is already a whole checkpoint (model.safetensors, optimizer.safetensors)\nHINT: "
                       "evaluate.py, generate.py and resume read it as it is")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise BadInput(f"{out} already exists\nHINT: name a new path; nothing is overwritten")
    if fmt == "safetensors":
        return _whole_checkpoint(path, state, out)
    if state.get("lora"):
        raise BadInput(f"{path} is a LoRA run's checkpoint (adapters only)\nHINT: the run's out_dir/adapter holds "
                       "them in PEFT's format; --format safetensors writes the whole checkpoint")
    model_state, _ = whole_state(path, state, model_only=True)
    model = registry.build(state.get("arch", "gpt2"), state["model_config"])
    model.load_state_dict(model_state)
    if fmt == "hf":
        model.save_pretrained(out)
    else:
        if not hasattr(model, "save_llmc"):
            raise BadInput(f"--format llmc: llm.c's file holds GPT-2 models; this checkpoint is {state.get('arch')!r}"
                           "\nHINT: use --format hf or safetensors")
        model.save_llmc(out)
    return out


def _whole_checkpoint(path, state, out):
    metadata = read_metadata(path)
    tensors = metadata["tensors"]
    model_names = {e[len("model/"):]: e for e in sorted(tensors) if e.startswith("model/")}
    index, groups = whole_param_groups(state["optimizer"]["param_groups"])
    per_param, optimizer_names = {}, {}
    for entry, name, key, info in optimizer_entries(tensors):
        i = index[name]
        if info["shape"]:
            per_param.setdefault(i, {})[key] = np.empty(0)  # a placeholder: the data is streamed
            optimizer_names[f"state.{i}.{key}"] = entry
        else:
            per_param.setdefault(i, {})[key] = int(whole_tensor(path, entry, metadata))
    _, skeleton = ckpt.flatten_state({"state": per_param, "param_groups": groups})
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.tmp")
    try:
        write_whole_safetensors(path, os.path.join(tmp, "model.safetensors"), model_names)
        write_whole_safetensors(path, os.path.join(tmp, "optimizer.safetensors"), optimizer_names)
        whole = {k: v for k, v in state.items() if k not in ("format", "files", "optimizer", "state_sha256")}
        whole.update(files={name: ckpt._fsync_and_describe(os.path.join(tmp, name)) for name in ckpt.TENSOR_FILES},
                     optimizer=skeleton, model_keys=list(model_names))
        whole["state_sha256"] = ckpt._state_digest(whole)
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump(whole, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m infini_train.tools.consolidate",
                                     description="Write a sharded checkpoint as one-process files.")
    parser.add_argument("checkpoint", help="a checkpoints/step_XXXXXX directory or a run's out_dir (newest)")
    parser.add_argument("out", help="the directory (safetensors, hf) or file (llmc) to write")
    parser.add_argument("--format", default="safetensors", help=f"{' | '.join(FORMATS)} (default safetensors)")
    args = parser.parse_args(argv)
    try:
        out = consolidate(args.checkpoint, args.out, args.format)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
