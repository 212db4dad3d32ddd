"""Multi-head latent attention's KV cache and decoding: what MLA keeps per token (the compressed latent and the rope
key) against a LLaMA of the same width (every head's keys and values), and the time per greedy token with the cache,
ours against HF's DeepseekV3ForCausalLM (torch) on the same weights. Nothing here is a test.

    python benchmarks/bench_mla.py cache                 # bytes per token: formula and the allocated caches
    python benchmarks/bench_mla.py decode --new 64       # ms per generated token, ours vs torch, MLA vs LLaMA

decode: a dense DeepSeek-V3 (SHAPE: 4 layers, width 256, 8 heads, q_lora_rank 128, kv_lora_rank 64, rope 32, nope 64,
v 64) and a LLaMA of the same width, layers and heads (head_dim 32), batch 4 after an 8-token prompt, greedy; each
ours with the cache (attention expanding the keys and values from it as HF does, or by weight absorption) and
without; HF's generate (its DynamicCache keeps MLA's latent too), one thread each (CPU time of the process), median
of the repeats.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SHAPE = dict(vocab_size=512, dim=256, n_layers=4, n_heads=8, intermediate_size=512, max_seq_len=256,
             q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
             first_k_dense_replace=4, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
             rope_scaling=dict(factor=4.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=1.0))


def cache(args):
    import infini_train as it
    from infini_train.models.deepseek_v3.config import DeepseekV3Config
    from infini_train.models.deepseek_v3.mla_cache import MLACache, cache_bytes_per_token
    from infini_train.models.attention import KVCache
    from infini_train.models.llama.config import LlamaConfig

    print("| model | dtype | MLA bytes/token | equal-width LLaMA bytes/token | LLaMA / MLA |")
    print("| --- | --- | ---: | ---: | ---: |")
    for preset, dtype in (("deepseek-v3", "bfloat16"), ("deepseek-v3-tiny", "float32")):
        cfg = DeepseekV3Config.from_preset(preset)
        size = 2 if dtype == "bfloat16" else 4
        b = cache_bytes_per_token(cfg, np.float16 if size == 2 else np.float32)
        print(f"| {preset} | {dtype} | {b['mla']:,} | {b['llama']:,} | {b['ratio']:.1f} |")
    cfg = DeepseekV3Config(**SHAPE)
    mla = MLACache(cfg, 1, it.backend.CPU)
    llama = KVCache(LlamaConfig(vocab_size=512, dim=256, n_layers=4, n_heads=8, n_kv_heads=8, max_seq_len=256,
                                rope_scaling=None), 1, it.backend.CPU)
    allocated = sum(a.nbytes for a in llama.keys + llama.values)
    print(f"\nallocated for {cfg.max_seq_len} positions (SHAPE, float32): MLACache {mla.nbytes():,} bytes, "
          f"KVCache of the equal-width LLaMA {allocated:,} bytes ({allocated / mla.nbytes():.1f}x)")


def _median_ms(fn, repeats, tokens):
    times = []
    for _ in range(repeats):
        start = time.process_time()  # CPU time of this one-thread process: steadier than wall time on a shared machine
        fn()
        times.append((time.process_time() - start) * 1000 / tokens)
    return statistics.median(times)


def decode(args):
    import torch
    from transformers import DeepseekV3Config as HFConfig, DeepseekV3ForCausalLM

    import infini_train as it
    from infini_train.models.llama.config import LlamaConfig
    from infini_train.models.llama.model import Llama

    torch.set_num_threads(1)
    s = SHAPE
    hf_cfg = HFConfig(vocab_size=s["vocab_size"], hidden_size=s["dim"], intermediate_size=s["intermediate_size"],
                      num_hidden_layers=s["n_layers"], num_attention_heads=s["n_heads"],
                      num_key_value_heads=s["n_heads"], q_lora_rank=s["q_lora_rank"],
                      kv_lora_rank=s["kv_lora_rank"], qk_nope_head_dim=s["qk_nope_head_dim"],
                      qk_rope_head_dim=s["qk_rope_head_dim"], v_head_dim=s["v_head_dim"],
                      first_k_dense_replace=s["n_layers"], max_position_embeddings=s["max_seq_len"],
                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, **s["rope_scaling"]))
    torch.manual_seed(0)
    hf = DeepseekV3ForCausalLM(hf_cfg).eval()
    hf.generation_config.eos_token_id = None
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = it.models.from_pretrained(d)
    llama = Llama(LlamaConfig(vocab_size=s["vocab_size"], dim=s["dim"], n_layers=s["n_layers"], n_heads=s["n_heads"],
                              n_kv_heads=s["n_heads"], intermediate_size=s["intermediate_size"],
                              max_seq_len=s["max_seq_len"], rope_scaling=None))
    prompt = np.random.default_rng(0).integers(0, s["vocab_size"], (4, 8))

    def absorbed(flag):
        ours.absorbed_decoding = flag
        try:
            return ours.generate(it.tensor(prompt), new, temperature=0)
        finally:
            ours.absorbed_decoding = False

    new = args.new
    rows = [("DeepSeek-V3 (MLA), ours, compressed cache", lambda: ours.generate(it.tensor(prompt), new, temperature=0)),
            ("DeepSeek-V3 (MLA), ours, compressed cache, absorbed", lambda: absorbed(True)),
            ("DeepSeek-V3 (MLA), ours, no cache",
             lambda: ours.generate(it.tensor(prompt), new, temperature=0, use_cache=False)),
            ("DeepSeek-V3 (MLA), HF generate (torch)",
             lambda: hf.generate(torch.tensor(prompt), max_new_tokens=new, do_sample=False,
                                 attention_mask=torch.ones(prompt.shape, dtype=torch.long))),
            ("LLaMA of the same width, ours, KV cache", lambda: llama.generate(it.tensor(prompt), new, temperature=0))]
    print("| model, path | ms / token (batch 4) |")
    print("| --- | ---: |")
    for name, fn in rows:
        fn()  # warm-up
        print(f"| {name} | {_median_ms(fn, args.repeats, new):.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["cache", "decode"])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    {"cache": cache, "decode": decode}[args.mode](args)


if __name__ == "__main__":
    main()
