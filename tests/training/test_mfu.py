"""MFU: FLOPs per token count what is computed (a frozen LoRA base weight has no weight gradient), the peak is the
device's stable figure (or train.peak_flops) and the log says which, and ranks sharing a host count it once."""
import numpy as np
import pytest

from infini_train import distributed as dist
from infini_train.models.gpt2 import GPT2, GPT2Config
from infini_train.models.llama import Llama
from infini_train.models.llama.config import LlamaConfig
from infini_train.models.pipeline_lm import PipelinedLM
from infini_train.nn.lora import apply_lora
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import metrics, run, tiny_args

T = 32


def _gpt2():
    return GPT2(GPT2Config(block_size=T, vocab_size=257, n_layer=2, n_head=2, n_embd=64))


def _expected(model, embeddings, n_layer, n_head, head_dim):
    """6 per trainable and 4 per frozen parameter that multiplies, plus the attention term (PaLM appendix B)."""
    params = [p for name, p in model.named_parameters() if name not in embeddings]
    trainable = sum(p.numel() for p in params if p.requires_grad)
    frozen = sum(p.numel() for p in params if not p.requires_grad)
    return 6 * trainable + 4 * frozen + 12 * n_layer * n_head * head_dim * T


def test_gpt2_flops_per_token_is_palms_formula():
    model = _gpt2()
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    assert model.flops_per_token(T) == 6 * n + 12 * 2 * 2 * 32 * T


@pytest.mark.parametrize("arch", ["gpt2", "llama3"])
def test_frozen_lora_base_weights_cost_no_weight_gradient(arch):
    if arch == "gpt2":
        model, embeddings, shape = _gpt2(), {"transformer.wpe.weight"}, (2, 2, 32)
    else:
        model = Llama(LlamaConfig(vocab_size=257, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=128,
                                  max_seq_len=T, tie_word_embeddings=False, rope_scaling=None))
        embeddings, shape = {"model.embed_tokens.weight"}, (2, 4, 16)
    whole = model.flops_per_token(T)
    apply_lora(model, 4, 16.0)
    lora = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    assert model.flops_per_token(T) == _expected(model, embeddings, *shape)
    # the base's weight gradients (2 per base parameter) are gone, the adapters cost 6 per parameter
    assert model.flops_per_token(T) == whole - 2 * model.num_params(non_embedding=True, trainable=False) + 6 * lora
    assert model.flops_per_token(T) < whole


def test_pipeline_stages_count_the_whole_model():
    model = apply_lora(_gpt2(), 4, 16.0)
    expected = model.flops_per_token(T)
    staged = PipelinedLM(model, dist.default_group())
    assert staged.flops_per_token(T) == expected
    assert staged.num_params(trainable=True) == model.num_params(trainable=True) > 0


def _mfu_rows(out):
    return [(r["mfu"], r["tokens_per_s"]) for r in metrics(out) if "loss" in r]


@needs_mpiexec
def test_lora_run_mfu_divides_the_computed_flops_by_the_configured_peak(data_dir, tmp_path):
    out = tmp_path / "lora"
    proc = run(tiny_args(data_dir, out, "train.num_iterations=3", "train.total_batch_size=256", "lora.rank=4",
                         "train.peak_flops=1e12"), ranks=2)
    # two ranks on one host: the host's peak once, not once per rank
    assert "MFU against 1.0 TFLOP/s (1 host: train.peak_flops per host)" in proc.stdout
    model = apply_lora(_gpt2(), 4, 16.0)
    flops = _expected(model, {"transformer.wpe.weight"}, 2, 2, 32)
    rows = _mfu_rows(out)
    assert len(rows) == 3
    for mfu, tokens_per_s in rows:
        assert mfu == pytest.approx(flops * tokens_per_s / 1e12, rel=1e-9)


@needs_mpiexec
def test_the_default_peak_is_the_hosts_vector_peak_counted_once(data_dir, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    lines = []
    for out, ranks in ((one, 1), (two, 2)):
        proc = run(tiny_args(data_dir, out, "train.num_iterations=2", "train.total_batch_size=256"), ranks=ranks)
        lines.append(next(x for x in proc.stdout.splitlines() if x.startswith("MFU against")))
    assert lines[0] == lines[1] and "(1 host: " in lines[0] and "FLOP/cycle" in lines[0]
    # the same model over the same peak: MFU per token/s (FLOPs per token / peak) is the same at 1 and 2 ranks
    per_token = [[mfu / tokens_per_s for mfu, tokens_per_s in _mfu_rows(out)] for out in (one, two)]
    np.testing.assert_allclose(per_token[1], per_token[0][0], rtol=1e-9)
    assert all(0 < mfu < 1 for out in (one, two) for mfu, _ in _mfu_rows(out))


def test_moe_flops_count_the_experts_a_token_is_routed_to():
    from infini_train.models.llama.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=257, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, intermediate_size=48,
                         moe_intermediate_size=16, num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1],
                         max_seq_len=T, tie_word_embeddings=True)
    model = Qwen3Moe(cfg)
    n = sum(p.numel() for p in model.parameters())
    per_expert = sum(p.numel() for p in model.model.layers[0].mlp.experts[0].parameters())
    assert per_expert == 3 * 32 * 16
    # two sparse layers, 4 of 6 experts unused by each token
    assert model.flops_per_token(T) == 6 * (n - 2 * 4 * per_expert) + 12 * 3 * 4 * 8 * T
    assert model.num_params() == n
    staged = PipelinedLM(model, dist.default_group())
    assert staged.flops_per_token(T) == model.flops_per_token(T)
