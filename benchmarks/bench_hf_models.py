"""LLaMA-3 and Qwen3-MoE training steps (forward, backward, AdamW) in infini_train and in torch eager (Hugging Face
transformers' LlamaForCausalLM / Qwen3MoeForCausalLM), side by side, on the same weights and batch.

    python benchmarks/bench_hf_models.py [--models llama3 qwen3_moe] [--steps 5] [--warmup 2]
    python benchmarks/bench_hf_models.py --device cuda:0 --precision fp32 bf16-mixed

The HF model is built from its config with a fixed seed and saved; infini_train loads that directory
(``it.models.from_pretrained``), so both train the same weights. Timed steps alternate between the two. Reports
tokens/s, the ratio infini_train/torch (above 1.0: infini_train faster) and MFU against the dense-GEMM peak measured
in the same run (bench_gpt2.py's). The loss is the mean cross-entropy of next-token targets in both, plus the
router's load-balancing loss for the MoE (its coefficient times HF's aux_loss; infini_train adds its own).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt2 as common  # noqa: E402  (its timers, GEMM peaks, autocast names and device setting)

SHAPES = {  # per device: the HF config's fields, and the batch
    "cpu": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=2048, B=4, T=128),
    "cuda": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=4, vocab_size=32000, B=8, T=1024),
}
MOE = {"cpu": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=192),
       "cuda": dict(num_experts=16, num_experts_per_tok=2, moe_intermediate_size=704)}


def hf_model(name, shape):
    import torch
    import transformers

    fields = {k: v for k, v in shape.items() if k not in ("B", "T")}
    fields.update(max_position_embeddings=shape["T"], rms_norm_eps=1e-6, tie_word_embeddings=False,
                  attention_dropout=0.0, use_cache=False)
    torch.manual_seed(0)
    if name == "llama3":
        config = transformers.LlamaConfig(rope_theta=500000.0, **fields)
        return transformers.LlamaForCausalLM(config)
    moe = MOE["cpu" if common.DEVICE == "cpu" else "cuda"]
    config = transformers.Qwen3MoeConfig(head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                                         decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                                         router_aux_loss_coef=0.01, output_router_logits=True, **moe, **fields)
    return transformers.Qwen3MoeForCausalLM(config)


def batch(shape):
    rng = np.random.default_rng(0)
    x = rng.integers(0, shape["vocab_size"], size=(shape["B"], shape["T"]))
    return x, rng.integers(0, shape["vocab_size"], size=(shape["B"], shape["T"]))


def build_torch(hf, shape):
    import torch

    dev = "cuda" if common.DEVICE != "cpu" else "cpu"
    hf = hf.train().to(dev)
    opt = torch.optim.AdamW(hf.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    x, y = (torch.tensor(a, device=dev) for a in batch(shape))
    low = common.LOW.get(common.PRECISION)
    coef = getattr(hf.config, "router_aux_loss_coef", 0.0)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=getattr(torch, low or "bfloat16"), enabled=low is not None):
            out = hf(x)
            loss = torch.nn.functional.cross_entropy(out.logits.view(-1, shape["vocab_size"]).float(), y.view(-1))
            if getattr(out, "aux_loss", None) is not None:
                loss = loss + coef * out.aux_loss
        loss.backward()
        opt.step()
        return loss.item()

    return step


def build_it(directory, shape):
    import infini_train as it

    model = it.models.from_pretrained(directory, device=common.DEVICE)
    opt = it.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    x, y = (it.tensor(a, device=common.DEVICE) for a in batch(shape))
    low = common.LOW.get(common.PRECISION)

    def step():
        opt.zero_grad()
        with it.autocast(common.DEVICE.split(":")[0], dtype=getattr(it, low or "bfloat16"), enabled=low is not None):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        return loss.item()

    return model, step


def run(name, steps, warmup):
    shape = SHAPES["cpu" if common.DEVICE == "cpu" else "cuda"]
    hf = hf_model(name, shape)
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        model, it_step = build_it(directory, shape)
    th_step = build_torch(hf, shape)
    first = (it_step(), th_step())
    for _ in range(warmup - 1):
        it_step()
        th_step()
    t_it, t_th = [], []
    for _ in range(steps):
        t_it.append(common._timed(it_step))
        t_th.append(common._timed(th_step))
    tokens = shape["B"] * shape["T"]
    result = {"model": name, "tokens_per_step": tokens, "first_loss": first,
              "it_tok_s": tokens / min(t_it), "torch_tok_s": tokens / min(t_th),
              "flops_per_step": model.flops_per_token(shape["T"]) * tokens}
    result["ratio"] = result["it_tok_s"] / result["torch_tok_s"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama3", "qwen3_moe"], choices=["llama3", "qwen3_moe"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N (needs cupy, and a CUDA build of torch)")
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=["fp32", *common.LOW])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    common.DEVICE = args.device
    if args.device == "cpu":
        peaks = {p: common.sgemm_peak() for p in args.precision}
    else:
        import cupy
        cupy.cuda.Device(int(args.device.partition(":")[2] or 0)).use()
        torch.cuda.set_device(int(args.device.partition(":")[2] or 0))
        peaks = {p: common.gpu_gemm_peak(common.LOW.get(p, "float32")) for p in args.precision}
    shape = SHAPES["cpu" if args.device == "cpu" else "cuda"]
    print(f"shape: {shape}; MoE: {MOE['cpu' if args.device == 'cpu' else 'cuda']}; dense GEMM peak "
          + ", ".join(f"{p} {v / 1e12:.2f} TFLOP/s" for p, v in peaks.items()))
    print(f"{'model':10s}{'precision':>11s}{'it tok/s':>10s}{'torch tok/s':>13s}{'ratio':>7s}{'it MFU':>8s}"
          f"{'torch MFU':>10s}  first loss it / torch")
    results = []
    for name in args.models:
        for precision in args.precision:
            common.PRECISION = precision
            r = run(name, args.steps, args.warmup)
            r["precision"] = precision
            seconds = {k: r["tokens_per_step"] / r[f"{k}_tok_s"] for k in ("it", "torch")}
            r.update({f"{k}_mfu": r["flops_per_step"] / s / peaks[precision] for k, s in seconds.items()})
            print(f"{name:10s}{precision:>11s}{r['it_tok_s']:10.0f}{r['torch_tok_s']:13.0f}{r['ratio']:7.2f}"
                  f"{100 * r['it_mfu']:7.1f}%{100 * r['torch_mfu']:9.1f}%  {r['first_loss'][0]:.4f} / "
                  f"{r['first_loss'][1]:.4f}", flush=True)
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
