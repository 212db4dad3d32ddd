"""fp16-mixed under pipeline parallelism (GPT-2 and LLaMA-3, every schedule, with data and tensor parallelism and
ZeRO) against the one-process fp16-mixed run with the same global batch. Only the last stage computes the loss
and scales it; the other stages backpropagate its scaled gradient and unscale with the same scale. The runs start
from a scale that overflows (2**22, doubling after 2 clean steps), so they skip steps, back off and grow again:
every stage must skip the same steps and hold the same scale as the one process, and train to its weights.

Each layout is compared with the same data- and tensor-parallel layout without a pipeline (one process for the
pipeline-only layouts): with two data-parallel replicas each rank backpropagates the mean loss of its own
micro-batches (DDP averages after backward), twice the one-process gradient of a micro-batch, so fp16 overflows at
other steps; tensor parallelism rounds each rank's partial products to float16 before the all-reduce sums them.
tests/training/test_precision.py compares those layouts with one process."""
import numpy as np
import pytest

from infini_train.run_state import list_checkpoints, load_checkpoint
from tests.distributed.mpi_jobs import needs_mpiexec
from tests.training.tiny_run import metrics, run, tiny_args

pytestmark = needs_mpiexec

COMMON = ["train.num_iterations=10", "train.total_batch_size=512", "train.grad_clip=0.5", "train.learning_rate=3e-3",
          "train.val_loss_every=0", "train.sample_every=0", "precision=fp16-mixed",
          "train.initial_loss_scale=4194304", "train.loss_scale_window=2"]
MODELS = {"gpt2": ["model.n_layer=4"],
          "llama3": ["model.arch=llama3", "model.n_layer=4", "model.n_head=4", "model.n_kv_head=2",
                     "model.intermediate_size=128"]}


def _pp(schedule):
    return ["parallel.pipeline=2", f"parallel.pipeline_schedule={schedule}",
            f"parallel.virtual_pipeline={2 if schedule == 'interleaved' else 1}"]


LAYOUTS = {
    # name: (model, ranks, settings); the layout without a pipeline is data parallel 2 for "dp2", tensor 2 for "tp2"
    "gpt2-pp2-gpipe": ("gpt2", 2, _pp("gpipe")),
    "gpt2-pp2-1f1b": ("gpt2", 2, _pp("1f1b")),
    "gpt2-pp2-interleaved": ("gpt2", 2, _pp("interleaved")),
    "gpt2-pp2xdp2-1f1b-zero2": ("gpt2", 4, _pp("1f1b") + ["parallel.zero_stage=2"]),
    "gpt2-pp2xtp2-interleaved": ("gpt2", 4, _pp("interleaved") + ["parallel.tensor=2"]),
    "llama3-pp2-1f1b": ("llama3", 2, _pp("1f1b")),
    "llama3-pp2xdp2-gpipe-zero1": ("llama3", 4, _pp("gpipe") + ["parallel.zero_stage=1"]),
}


@pytest.fixture(scope="module")
def references(data_dir, tmp_path_factory):
    """reference(model, layout) -> the out_dir of the run with ``layout``'s data and tensor parallelism and no
    pipeline (run once per model and layout)."""
    runs = {}

    def reference(model, layout):
        name, ranks, extra = (("tp2", 2, ["parallel.tensor=2"]) if "tp2" in layout else ("dp2", 2, []) if "dp2" in
                              layout else ("one", 1, []))
        if (model, name) not in runs:
            runs[model, name] = tmp_path_factory.mktemp(f"{model}-{name}")
            run(tiny_args(data_dir, runs[model, name], *COMMON, *MODELS[model], *extra), ranks=ranks)
        return runs[model, name]
    return reference


def _rows(out):
    return [r for r in metrics(out) if "loss" in r]


@pytest.mark.parametrize("model", list(MODELS))
def test_the_one_process_run_overflows_backs_off_and_grows(references, model):
    rows = _rows(references(model, "one process"))
    scales = [r["loss_scale"] for r in rows]
    assert scales[0] == 2.0 ** 22 and min(scales) < scales[0]
    assert any(r["skipped"] for r in rows) and not all(r["skipped"] for r in rows)
    assert any(b > a for a, b in zip(scales, scales[1:]))  # grown again after 2 clean steps
    # steps the GradScaler skipped count as skipped steps
    assert [r["skipped_steps"] for r in rows] == list(np.cumsum([r["skipped"] for r in rows]))


@pytest.mark.layouts
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fp16_pipeline_layout_skips_and_scales_as_the_run_without_pipeline(data_dir, references, tmp_path, layout):
    model, ranks, extra = LAYOUTS[layout]
    out = tmp_path / layout
    run(tiny_args(data_dir, out, *COMMON, *MODELS[model], *extra), ranks=ranks)
    mine, reference = _rows(out), _rows(references(model, layout))
    assert [(r["step"], r["loss_scale"], r["skipped"]) for r in mine] == \
           [(r["step"], r["loss_scale"], r["skipped"]) for r in reference]
    np.testing.assert_allclose([r["loss"] for r in mine], [r["loss"] for r in reference], rtol=1e-4)
    weights, _, state = load_checkpoint(list_checkpoints(out)[-1])
    ref_weights, _, ref_state = load_checkpoint(list_checkpoints(references(model, layout))[-1])
    assert state["grad_scaler"] == ref_state["grad_scaler"]
    assert list(weights) == list(ref_weights)
    for name in ref_weights:
        # within lr / 30 (a step taken or skipped on one stage alone moves its weights by about lr = 3e-3); GPT-2's
        # key bias (c_attn.bias[n_embd:2 n_embd]) has a zero gradient up to rounding (softmax ignores a constant
        # added to a query's scores), so Adam moves it by float16 rounding noise: within lr / 10
        atol = 3e-4 if name.endswith("attn.c_attn.bias") else 1e-4
        np.testing.assert_allclose(np.asarray(weights[name]), np.asarray(ref_weights[name]), rtol=1e-3, atol=atol,
                                   err_msg=name)
