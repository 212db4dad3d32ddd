"""Write a run checkpoint as one-process files: a sharded checkpoint as a whole-format one, or any checkpoint's model
as a Hugging Face directory or llm.c's file, or a LoRA run's adapter in PEFT's format.

    python -m infini_train.tools.consolidate CHECKPOINT OUT                     # a whole-format checkpoint directory
    python -m infini_train.tools.consolidate CHECKPOINT OUT --format hf         # a Hugging Face model directory
    python -m infini_train.tools.consolidate CHECKPOINT OUT.bin --format llmc   # llm.c's model file (GPT-2)
    python -m infini_train.tools.consolidate LORA_RUN OUT --format hf --merge-lora   # the base, adapters merged in
    python -m infini_train.tools.consolidate LORA_RUN OUT --format peft         # the adapter alone, for PEFT

``safetensors`` (the default, sharded checkpoints): OUT becomes a checkpoint directory in the whole format
(model.safetensors, optimizer.safetensors, state.json with fresh hashes) that resume, evaluate.py and generate.py read
like any other; both files are streamed from the shards one tensor at a time, so the tool never holds more than the
largest tensor. ``hf`` and ``llmc`` (whole or sharded checkpoints): the model is assembled in this process and written
by the model's own exporter (transformers loads the HF directory). A LoRA run's checkpoint holds adapters and a
reference to their base: ``--merge-lora`` writes the base with the adapters merged in (as generate.py and evaluate.py
load it), ``--format peft`` the adapter alone (adapter_config.json + adapter_model.safetensors, as the run writes to
out_dir/adapter: peft's PeftModel.from_pretrained loads it onto the base).

CHECKPOINT may be a step directory or a run's out_dir: its newest checkpoint that verifies, with a warning naming each
newer one skipped and why (as resume=auto, evaluate.py and generate.py take it). The files read are verified against
state.json's hashes first (for a model export, only those holding the model). Directories written honour the umask.
Exit status: 0, or 2 on bad input (the message says why).
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import backend
from ..distributed.checkpoint import read_metadata
from ..distributed.checkpoint.whole_files import whole_tensor
from ..models import registry
from ..models.pretrained import mapped_pretrained
from ..nn.lora import LoRAError, apply_lora, load_lora_state_dict, merge_and_unload, save_adapter
from ..progress import progress
from ..run_state import CheckpointError, is_sharded, lora_base, verified_checkpoint, whole_files
from ..run_state.reader import whole_state
from ..run_state.writer import write_whole_directory

FORMATS = ("safetensors", "hf", "llmc", "peft")
MODEL_FORMATS = ("hf", "llmc")


class BadInput(ValueError):
    """A checkpoint or destination the tool cannot use."""


def consolidate(checkpoint, out, fmt="safetensors", merge_lora=False, warn=None):
    """Write checkpoint ``checkpoint`` (a step directory or a run's out_dir) to ``out`` in ``fmt``; returns ``out``.
    ``merge_lora``: a LoRA checkpoint's model with its adapters merged in (hf, llmc); ``warn(message)``: each newer
    checkpoint of an out_dir skipped as damaged."""
    if fmt not in FORMATS:
        raise BadInput(f"--format: expected one of {FORMATS}, got {fmt!r}")
    if merge_lora and fmt not in MODEL_FORMATS:
        raise BadInput(f"--merge-lora: expected --format hf or llmc (a model file), got --format {fmt}\nHINT: "
                       "--format peft writes the adapter alone; a LoRA checkpoint's --format safetensors keeps it as "
                       "it is (adapters and their base's reference)")
    try:
        path, state = verified_checkpoint(checkpoint, model_only=fmt != "safetensors", warn=warn)
    except CheckpointError as exc:
        raise BadInput(str(exc)) from None
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise BadInput(f"{out} already exists\nHINT: name a new path; nothing is overwritten")
    lora = state.get("lora")
    if fmt == "safetensors":
        if not is_sharded(state):
            raise BadInput(f"{path} is already a whole checkpoint (model.safetensors, optimizer.safetensors)\nHINT: "
                           "evaluate.py, generate.py and resume read it as it is; --format hf or llmc export its model")
        return _whole_checkpoint(path, state, out)
    if fmt == "peft":
        if not lora:
            raise BadInput(f"--format peft: {path} is a whole model's checkpoint (no LoRA adapters)\nHINT: use "
                           "--format hf or llmc for its model")
        return _write_peft(path, state, out)
    if lora and not merge_lora:
        raise BadInput(f"--format {fmt}: {path} is a LoRA run's checkpoint (adapters and a reference to their base)"
                       "\nHINT: pass --merge-lora for the base with the adapters merged in, or use --format peft for "
                       "the adapter alone")
    if merge_lora and not lora:
        raise BadInput(f"--merge-lora: {path} is a whole model's checkpoint (no LoRA adapters to merge)\nHINT: leave "
                       "--merge-lora out")
    model = _model(path, state)
    if fmt == "hf":
        model.save_pretrained(out)
    else:
        if not hasattr(model, "save_llmc"):
            raise BadInput(f"--format llmc: llm.c's file holds GPT-2 models; this checkpoint is {state.get('arch')!r}"
                           "\nHINT: use --format hf")
        model.save_llmc(out)
    return out


def _model_state(path, state):
    """{name: array} of the checkpoint's model entries (a LoRA run's: its adapters), whole."""
    try:
        return whole_state(path, state, model_only=True)[0]
    except CheckpointError as exc:
        raise BadInput(str(exc).split("\nHINT")[0]) from None


def _model(path, state):
    """The checkpoint's model; a LoRA run's: its pinned base with the adapters merged in, as plain layers (what
    generate.py and evaluate.py load)."""
    model_state = _model_state(path, state)
    reference = state.get("lora")
    if reference:  # the seeded init the run started from, for a base that was not loaded from elsewhere
        backend.manual_seed(reference["seed"])
    model = registry.build(state.get("arch", "gpt2"), state["model_config"])
    if not reference:
        model.load_state_dict(model_state)
        return model
    try:
        return merge_and_unload(lora_base.rebuild(model, reference, model_state, mapped_pretrained))
    except (CheckpointError, LoRAError) as exc:
        raise BadInput(f"--merge-lora: {exc}") from None


def _write_peft(path, state, out):
    """The LoRA checkpoint's adapter in PEFT's format, as the run writes it to out_dir/adapter (the base is not read:
    the model is built on the meta device and only the adapters get storage)."""
    reference = state["lora"]
    adapters = _model_state(path, state)
    with backend.META:
        model = registry.build(state.get("arch", "gpt2"), state["model_config"])
        try:
            apply_lora(model, reference["rank"], reference["alpha"], reference["dropout"],
                       lora_base.targets(reference["target_modules"]))
        except LoRAError as exc:
            raise BadInput(f"--format peft: lora.target_modules: {exc}") from None
    model.to_empty(device=backend.CPU).to(dtype=(state.get("config") or {}).get("dtype", "float32"))
    load_lora_state_dict(model, adapters)
    save_adapter(model, out, base_model_name_or_path=reference.get("base_source") or reference.get("base"))
    return out


def _whole_checkpoint(path, state, out):
    """The sharded checkpoint in ``path`` written at ``out`` in the whole format, as a one-process run writes it
    (the tensors streamed from the shards one at a time)."""
    metadata = read_metadata(path)
    tensors = metadata["tensors"]
    model_keys = state.get("model_keys") or sorted(e[len("model/"):] for e in tensors if e.startswith("model/"))
    files, skeleton = whole_files.layout(model_keys, state["optimizer"]["param_groups"], tensors,
                                         lambda entry: whole_tensor(path, entry, metadata).item())
    infos = {entry: (tuple(info["shape"]), info["dtype"]) for entry, info in tensors.items()}
    kept = {k: v for k, v in state.items() if k not in ("step", "run_id", "format", "files", "optimizer", "model_keys",
                                                         "state_sha256")}
    with progress(total=len(infos), desc="consolidating", unit="tensor") as bar:
        def read(entry):
            bar.update(1)
            return whole_tensor(path, entry, metadata)

        return write_whole_directory(out, files, infos, read, {"optimizer": skeleton, "model_keys": model_keys, **kept},
                                     state["step"], state.get("run_id"))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m infini_train.tools.consolidate",
                                     description="Write a run checkpoint as one-process files (whole checkpoint, "
                                                 "Hugging Face, llm.c) or a LoRA run's adapter for PEFT.")
    parser.add_argument("checkpoint", help="a checkpoints/step_XXXXXX directory or a run's out_dir (its newest "
                                           "checkpoint that verifies)")
    parser.add_argument("out", help="the directory (safetensors, hf, peft) or file (llmc) to write")
    parser.add_argument("--format", default="safetensors", help=f"{' | '.join(FORMATS)} (default safetensors)")
    parser.add_argument("--merge-lora", action="store_true", help="a LoRA run's checkpoint: write its base with the "
                                                                  "adapters merged in (--format hf or llmc)")
    args = parser.parse_args(argv)
    try:
        out = consolidate(args.checkpoint, args.out, args.format, args.merge_lora,
                          warn=lambda message: print(f"warning: {message}", file=sys.stderr, flush=True))
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
