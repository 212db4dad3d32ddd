"""The numerics checker's level-1 entries of a GPT-2 run, computed in torch: Hugging Face's GPT2LMHeadModel with
the run's weights (its seeded init, or a checkpoint's), the same batches, loss, gradient clipping, AdamW and
learning-rate schedule, with module hooks named by infini_train's module paths. Compare with the run's file to
find the first module where the two frameworks differ:

    python examples/gpt2/train.py numerics.level=1 train.num_iterations=2 out_dir=runs/p
    python benchmarks/numerics_reference_torch.py out_dir=runs/p --steps 2     # -> runs/p/numerics_torch/
    python -m infini_train.tools.compare_numerics runs/p/numerics/rank0.jsonl \\
        runs/p/numerics_torch/rank0.jsonl --rtol 1e-4

Takes the run's config the way train.py does (--config FILE plus dotted overrides). The reference is the
one-process run (compare with a run of one rank, or the same global batch on rank 0 of a data-parallel run only
when the data-parallel size is 1). ``--checkpoint DIR`` starts from a checkpoint's weights, step and data
position; the optimizer starts fresh there, so only the first step's entries are comparable then.

Names: HF's GPT-2 modules match infini_train's paths (transformer.h.0.attn, ...) except where noted in
``our_name``; Conv1D weight gradients are transposed to nn.Linear's (out, in) layout; the position embedding's
output (1, T, C) is recorded as (T, C), as infini_train computes it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def our_name(hf_name):
    """infini_train's path of the HF module ``hf_name``, or None where it has no module that runs."""
    if hf_name in ("", "transformer", "transformer.h"):
        return None  # the root is recorded by hand (model[0] logits, model[1] loss); GPT2Model and the ModuleList
        # have no forward of their own in infini_train's GPT-2 (a ModuleDict and a ModuleList)
    if hf_name.endswith(".attn.attn_dropout"):
        return None  # infini_train applies attention dropout inside its attention function, not as a module
    if hf_name.endswith(".mlp.act"):
        return hf_name[: -len("act")] + "gelu"
    return hf_name


def is_conv1d_weight(name):
    return ".h." in name and name.endswith(CONV1D_WEIGHTS)


class TorchRecorder:
    """The numerics checker's level-1 entries of a torch model, with infini_train's names."""

    def __init__(self):
        self.entries, self.step = [], 0

    def record(self, phase, name, tensor):
        import torch

        from infini_train.training.tensor_stats import dtype_name, tensor_stats

        t = tensor.detach().cpu()
        if name == "transformer.wpe" and t.dim() == 3 and t.shape[0] == 1:
            t = t[0]  # HF embeds position_ids (1, T); infini_train embeds arange(T)
        if phase == "grad" and is_conv1d_weight(name):
            t = t.T  # Conv1D (in, out) -> nn.Linear's (out, in)
        array = (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()  # no numpy bf16
        entry = {"step": self.step, "phase": phase, "name": name, "shape": list(array.shape),
                 "dtype": dtype_name(tensor.dtype)}
        entry.update(tensor_stats(array))
        self.entries.append(entry)

    def output(self, name, out):
        """Forward entry of a module output (a tuple's first tensor) and a hook for its gradient."""
        t = out[0] if isinstance(out, (tuple, list)) else out
        self.record("forward", name, t)
        if t.requires_grad:
            t.register_hook(lambda g: self.record("backward", name, g))

    def attach(self, hf):
        for hf_name, module in hf.named_modules():
            name = our_name(hf_name)
            if name is not None:
                module.register_forward_hook(lambda m, args, out, name=name: self.output(name, out))
        for name, p in hf.named_parameters():  # tied lm_head.weight is transformer.wte.weight, as in infini_train
            p.register_hook(lambda g, name=name: self.record("grad", name, g))

    def write(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in self.entries)
        os.replace(tmp, path)



def build_hf(model_cfg, state, dtype):
    """GPT2LMHeadModel with infini_train's weights ``state`` ({name: array}, nn.Linear layout)."""
    import torch
    from transformers import GPT2Config as HFConfig
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(HFConfig(n_embd=model_cfg.n_embd, n_layer=model_cfg.n_layer, n_head=model_cfg.n_head,
                                  vocab_size=model_cfg.vocab_size, n_positions=model_cfg.block_size,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                  activation_function="gelu_new", bos_token_id=None, eos_token_id=None))
    hf = hf.to(getattr(torch, dtype)).train()
    weights = {k: torch.tensor(v.T if is_conv1d_weight(k) else v).contiguous() for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to transformer.wte.weight
    if missing or unexpected:
        raise ValueError(f"numerics_reference_torch: the weights do not fit HF's GPT-2: missing {missing}, "
                         f"unexpected {unexpected}")
    return hf


def check_config(cfg, model_cfg):
    problems = []
    if cfg.model.arch != "gpt2":
        problems.append(f"model.arch: expected 'gpt2', got {cfg.model.arch!r}")
    if model_cfg.dropout:
        problems.append(f"model.dropout: expected 0 (the frameworks draw different masks), got {model_cfg.dropout}")
    if not model_cfg.bias:
        problems.append("model.bias: expected true (HF's GPT-2 always has biases), got false")
    if cfg.precision != "fp32":
        problems.append(f"precision: expected 'fp32', got {cfg.precision!r}")
    if cfg.lora.rank:
        problems.append(f"lora.rank: expected 0, got {cfg.lora.rank}")
    if problems:
        raise SystemExit("numerics_reference_torch: " + "; ".join(problems) +
                         "\nHINT: run the reference on the run's config with these settings changed in both")


def main(argv=None):
    import torch

    from infini_train import backend
    from infini_train.data.corpus import ensure_default_data
    from infini_train.data.loader import DistributedDataLoader
    from infini_train.optim.lr_scheduler import cosine_with_warmup
    from infini_train.training.model_build import build_model
    import infini_train.run_state as ckpt
    from infini_train.training.config import default_config_path, load_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="the run's YAML config (default configs/gpt2_tiny.yaml)")
    parser.add_argument("--steps", type=int, default=1, help="optimizer steps to record (default 1)")
    parser.add_argument("--out", default=None, help="JSONL path (default out_dir/numerics_torch/rank0.jsonl)")
    parser.add_argument("--checkpoint", default=None, help="start from this checkpoint's weights, step and data")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, as train.py takes them")
    args = parser.parse_intermixed_args(argv)
    cfg = load_config(args.config or default_config_path(), args.overrides)
    model_cfg = cfg.model.to_model_config()
    check_config(cfg, model_cfg)
    torch.manual_seed(cfg.seed)
    ensure_default_data(cfg.data)
    t = cfg.train
    loader = DistributedDataLoader(cfg.data.train, t.batch_size, t.sequence_length, 0, 1, config_key="data.train")
    start = 0
    if args.checkpoint:
        state, _, meta = ckpt.load_checkpoint(args.checkpoint)
        loader.load_state_dict(meta["data"][0])
        start = meta["step"]
    else:
        model = build_model(cfg, backend.CPU)[0].model
        state = {k: v.numpy() for k, v in model.state_dict().items()}
    hf = build_hf(model_cfg, state, cfg.dtype)
    rec = TorchRecorder()
    rec.attach(hf)
    params = list(hf.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=t.learning_rate, betas=(t.beta1, t.beta2), eps=t.eps, foreach=False)
    grad_accum = cfg.grad_accum_steps(1)
    V = model_cfg.vocab_size
    for step in range(start, min(start + args.steps, t.num_iterations)):
        rec.step = step
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(grad_accum):
            if t.overfit_single_batch:
                loader.reset()
            x, y = (torch.from_numpy(a.astype("int64")) for a in loader.next_batch())
            logits = hf(x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, V), y.view(-1), ignore_index=-1)
            rec.output("model[0]", logits)
            rec.output("model[1]", loss)
            (loss / grad_accum).backward()
            loss_sum += loss.item() / grad_accum
        norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip > 0 else float("inf"))
        lr = cosine_with_warmup(step, t.learning_rate, t.warmup_iters, t.num_iterations, t.learning_rate_decay_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        if torch.isfinite(norm) and loss_sum == loss_sum and abs(loss_sum) != float("inf"):
            opt.step()
        print(f"step {step}: loss {loss_sum:.6f} | norm {float(norm):.4f} | lr {lr:.2e}", flush=True)
    out = args.out or os.path.join(cfg.out_dir, "numerics_torch", "rank0.jsonl")
    rec.write(out)
    print(f"wrote {len(rec.entries)} entries to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
