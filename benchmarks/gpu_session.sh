#!/usr/bin/env bash
# Everything the GPU path needs checked, in one call on a machine with an NVIDIA GPU, cupy and a CUDA build of torch:
#   1. the cuda-marked tests, and the op-check suite on the GPU against torch CUDA (pytest --op-device cuda:0)
#   2. train.py on the GPU (tiny and GPT-2 124M shapes, fp32 and bf16-mixed), mpirun -n 1 with NCCL (DDP, ZeRO),
#      two ranks sharing the GPU (NCCL, and MPI for tensor / pipeline parallelism), generate and evaluate
#   3. the registry's kernels (infini_train/kernels/registry.py), alone on the GPU: their cuda checks (among the
#      cuda tests when phase 1 runs; tests/kernels/test_*_cuda.py: each kernel against its NumPy reference and the
#      array path), then benchmarks/check_kernels.py's results table (kernel, dtype, shape, max error vs the array
#      path, bitwise, time vs the array path) into the summary
#   4. benchmarks/bench_gpt2.py --device cuda:0 (GPT-2 124M, B8 T1024, fp32 and bf16-mixed) against torch eager with
#      the kernels a plain run uses (INFINI_TRAIN_KERNELS=candidate for every one; BASELINE=1 adds the array path),
#      then benchmarks/bench_hf_models.py (LLaMA-3 and Qwen3-MoE against transformers' models)
#   5. one profiled step of GPT-2 124M (B8 T1024) in each of PROFILE_PRECISIONS (default fp32 bf16-mixed)
# Phases 1 and 2 run side by side (neither is timed); the kernels' table, the benchmarks and the profile run alone
# after them.
#
#   bash benchmarks/gpu_session.sh [LOG_DIR]          (default /tmp/gpu_session)
#   PHASES="tests ops runs profile kernels bench" (default all)   RUNS="tiny-fp32 ..." (default all the runs below)
#   OPS_PATHS=... (default: every test file that uses the op checks)
#   PYTHON=... (default: a venv over python3 with the wheels in .whl/ (mpi4py, mpich) installed, when python3 has
#   no mpiexec beside it)   DEVICE=cuda:0   LIMIT=seconds per phase
# Logs (at most 8 files): env.log tests.log (+ the kernels' checks and table) ops.log runs.log profile.txt bench.log
# (every benchmark run) bench.json (GPT-2's) summary.txt (+ the table).
set -u
cd "$(dirname "$0")/.."
LOG=${1:-/tmp/gpu_session}
PHASES=${PHASES:-tests ops runs profile kernels bench}
OPS_PATHS=${OPS_PATHS:-$(grep -rl "op_check\|op_device" tests --include="test_*.py" | sort | tr '\n' ' ')}
DEVICE=${DEVICE:-cuda:0}
LIMIT=${LIMIT:-240}
WORK=${WORK:-/tmp/gpu_session_work}
BIG_STEPS=${BIG_STEPS:-6}
mkdir -p "$LOG" "$WORK"
rm -f "$LOG/summary.txt"
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)

if [ -z "${PYTHON:-}" ]; then
    base=$(command -v python3)
    if [ -x "$(dirname "$base")/mpiexec" ] || [ ! -d .whl ]; then
        PYTHON=$base
    else  # a venv that sees python3's packages, with mpi4py + MPICH installed where mpi4py looks for libmpi
        python3 -m venv "$WORK/venv" >/dev/null &&
            python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
                > "$WORK/venv/lib/python3.$(python3 -c 'import sys; print(sys.version_info[1])')/site-packages/base.pth" &&
            "$WORK/venv/bin/python" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
        PYTHON=$WORK/venv/bin/python
    fi
fi
MPIEXEC=$(dirname "$PYTHON")/mpiexec
{
    date; nvidia-smi 2>&1 | head -15
    "$PYTHON" - <<'EOF'
import sys, numpy, cupy, torch
print("python", sys.version.split()[0], "numpy", numpy.__version__, "cupy", cupy.__version__,
      "torch", torch.__version__, "cuda", torch.version.cuda)
print("cupy sees", cupy.cuda.runtime.getDeviceCount(), "GPU(s):",
      cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
try:
    from cupy.cuda import nccl
    print("nccl", nccl.get_version())
except Exception as exc:
    print("nccl unavailable:", exc)
from mpi4py import MPI
print(MPI.Get_library_version().splitlines()[0])
EOF
} > "$LOG/env.log" 2>&1
tail -4 "$LOG/env.log"

on() { [[ " $PHASES " == *" $1 "* ]]; }

# ---- 1. the cuda-marked tests (pytest -m cuda), and the op checks on the GPU
if on tests; then
    (t=$(date +%s); timeout -s INT -k 10 "$LIMIT" "$PYTHON" -m pytest -m cuda -n 4 -q -rfEs --timeout=300 -p no:cacheprovider \
        > "$LOG/tests.log" 2>&1; echo "tests rc=$? $(( $(date +%s) - t ))s: $(tail -1 "$LOG/tests.log")" \
        >> "$LOG/summary.txt") &
fi
if on ops; then
    (t=$(date +%s); timeout -s INT -k 10 "$LIMIT" "$PYTHON" -m pytest --op-device "$DEVICE" -n 8 -q -rfE --timeout=120 \
        -p no:cacheprovider $OPS_PATHS \
        > "$LOG/ops.log" 2>&1; echo "ops rc=$? $(( $(date +%s) - t ))s: $(tail -1 "$LOG/ops.log")" \
        >> "$LOG/summary.txt") &
fi

# ---- 2. training, generation and evaluation on the GPU
runs() {
    local T="$PYTHON examples/gpt2/train.py --config configs/gpt2_tiny.yaml plot=false train.log_every=5"
    local D="$PYTHON examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml plot=false train.log_every=5"
    local short="train.num_iterations=20 train.val_loss_every=10 train.sample_every=20 train.save_every=20"
    local big="'model={n_layer: 12, n_head: 12, n_embd: 768, vocab_size: 50304, block_size: 1024}' \
train.batch_size=8 train.sequence_length=1024 train.total_batch_size=8192 train.num_iterations=$BIG_STEPS \
train.val_loss_every=0 train.sample_every=0 train.save_every=0 train.log_every=1"
    step() {  # name, command...: runs it (when RUNS is unset or names it), records rc and seconds in the summary
        local name=$1; shift; local t=$(date +%s)
        [ -n "${RUNS:-}" ] && [[ " $RUNS " != *" $name "* ]] && return
        echo "===== $name: $*" >> "$LOG/runs.log"
        timeout -k 10 180 bash -c "$*" >> "$LOG/runs.log" 2>&1
        echo "runs $name rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
    }
    step tiny-fp32 "$T device=$DEVICE out_dir=$WORK/tiny $short"
    step tiny-bf16 "$T device=$DEVICE out_dir=$WORK/tiny_bf16 precision=bf16-mixed $short"
    step 124M-fp32 "$T device=$DEVICE out_dir=$WORK/d12 $big"
    step 124M-bf16 "$T device=$DEVICE out_dir=$WORK/d12_bf16 precision=bf16-mixed $big"
    step generate "$PYTHON examples/gpt2/generate.py --checkpoint $WORK/tiny --device $DEVICE --prompt 'def main(' \
        --max-new-tokens 64 --top-k 40"
    step generate-bf16 "$PYTHON examples/gpt2/generate.py --checkpoint $WORK/tiny --device $DEVICE --precision bf16-mixed \
        --prompt 'import os' --max-new-tokens 32 --temperature 0"
    step evaluate "$PYTHON examples/gpt2/evaluate.py --checkpoint $WORK/tiny --device $DEVICE \
        --data 'data/stdlib_byte/val_*.bin'"
    step nccl-ddp1 "$MPIEXEC -n 1 $D device=$DEVICE backend=nccl out_dir=$WORK/ddp1 $short"
    step nccl-zero2 "$MPIEXEC -n 1 $D device=$DEVICE backend=nccl parallel.zero_stage=2 out_dir=$WORK/zero2 $short"
    step nccl-zero3 "$MPIEXEC -n 1 $D device=$DEVICE backend=nccl parallel.zero_stage=3 out_dir=$WORK/zero3 $short"
    step nccl-2ranks-1gpu "$MPIEXEC -n 2 $D device=$DEVICE backend=nccl out_dir=$WORK/nccl2 train.num_iterations=4"
    step mpi-tp2-sp "$MPIEXEC -n 2 $D device=$DEVICE backend=mpi parallel.tensor=2 parallel.sequence=true \
        train.total_batch_size=1024 out_dir=$WORK/tp2 $short"
    step mpi-pp2 "$MPIEXEC -n 2 $D device=$DEVICE backend=mpi parallel.pipeline=2 train.total_batch_size=2048 \
        out_dir=$WORK/pp2 $short"
    step mpi-dp2-zero3 "$MPIEXEC -n 2 $D device=$DEVICE backend=mpi parallel.zero_stage=3 out_dir=$WORK/dpz3 $short"
    local M="$PYTHON examples/gpt2/train.py --config configs/qwen3_moe_tiny.yaml plot=false train.log_every=5"
    step mpi-ep2-moe "$MPIEXEC -n 2 $M device=$DEVICE backend=mpi parallel.expert=2 train.total_batch_size=2048 \
        out_dir=$WORK/ep2 $short"
    step mpi-ep2-zero3-moe "$MPIEXEC -n 2 $M device=$DEVICE backend=mpi parallel.expert=2 parallel.zero_stage=3 \
        train.total_batch_size=2048 out_dir=$WORK/ep2z3 $short"
    step nccl-zero3-moe "$MPIEXEC -n 1 $M device=$DEVICE backend=nccl parallel.zero_stage=3 out_dir=$WORK/moez3 $short"
    step mpi-cp2-ring "$MPIEXEC -n 2 $D device=$DEVICE backend=mpi parallel.context=2 train.total_batch_size=1024 \
        out_dir=$WORK/cp2 $short"
    step mpi-cp2-ring-bf16 "$MPIEXEC -n 2 $D device=$DEVICE backend=mpi parallel.context=2 precision=bf16-mixed \
        train.total_batch_size=1024 out_dir=$WORK/cp2bf16 $short"
}
if on runs; then
    runs &
fi
wait

# ---- 3. the registry's kernels against the array path, alone on the GPU (their checks, unless the tests phase ran
# them among the cuda tests, then the results table)
if on kernels; then
    if ! on tests; then
        t=$(date +%s)
        { echo "===== kernels: INFINI_TRAIN_KERNELS=candidate pytest tests/kernels/test_*_cuda.py"
          INFINI_TRAIN_KERNELS=candidate timeout -s INT -k 10 "$LIMIT" "$PYTHON" -m pytest -m cuda -q -rfEs \
            --timeout=300 -p no:cacheprovider tests/kernels/test_*_cuda.py; } >> "$LOG/tests.log" 2>&1
        echo "kernels tests rc=$? $(( $(date +%s) - t ))s: $(tail -1 "$LOG/tests.log")" >> "$LOG/summary.txt"
    fi
    t=$(date +%s)
    { echo "===== kernels: benchmarks/check_kernels.py (the results table)"
      INFINI_TRAIN_KERNELS=candidate timeout -k 10 "$LIMIT" "$PYTHON" benchmarks/check_kernels.py --device "$DEVICE" \
        --out "$WORK/kernels.md"; } >> "$LOG/tests.log" 2>&1
    echo "kernels table rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
    cat "$WORK/kernels.md" >> "$LOG/summary.txt" 2>/dev/null
fi

# ---- 4. the benchmarks, alone on the GPU: GPT-2 124M with the kernels a plain run uses (the verified ones), then
# LLaMA-3 and Qwen3-MoE against Hugging Face's models; BASELINE=1 adds GPT-2 on the array path (INFINI_TRAIN_KERNELS=none)
if on bench; then
    t=$(date +%s)
    { echo "===== GPT-2 124M, the verified kernels (${INFINI_TRAIN_KERNELS:-default})"
      timeout -k 10 "$LIMIT" "$PYTHON" benchmarks/bench_gpt2.py --device "$DEVICE" --configs d12-B8-T1024 \
        --precision fp32 bf16-mixed --steps 6 --warmup 2 --json "$LOG/bench.json"; } > "$LOG/bench.log" 2>&1
    echo "bench gpt2 rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
    t=$(date +%s)
    { echo "===== LLaMA-3 and Qwen3-MoE against transformers"
      timeout -k 10 "$LIMIT" "$PYTHON" benchmarks/bench_hf_models.py --device "$DEVICE" --precision fp32 bf16-mixed \
        --steps 5 --warmup 2; } >> "$LOG/bench.log" 2>&1
    echo "bench hf models rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
    if [ "${BASELINE:-0}" = 1 ]; then
        t=$(date +%s)
        { echo "===== GPT-2 124M, INFINI_TRAIN_KERNELS=none"
          INFINI_TRAIN_KERNELS=none timeout -k 10 "$LIMIT" "$PYTHON" benchmarks/bench_gpt2.py --device "$DEVICE" \
            --configs d12-B8-T1024 --precision fp32 bf16-mixed --steps 6 --warmup 2; } >> "$LOG/bench.log" 2>&1
        echo "bench gpt2 array path rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
    fi
    grep -v "^Writing\|^step" "$LOG/bench.log" | tail -20
fi

# ---- 5. where the time of a GPT-2 124M step goes (PROFILE_PRECISIONS, default fp32 bf16-mixed)
if on profile; then
    for precision in ${PROFILE_PRECISIONS:-fp32 bf16-mixed}; do
        t=$(date +%s)
        timeout -k 10 "$LIMIT" "$PYTHON" examples/gpt2/train.py --config configs/gpt2_tiny.yaml plot=false device="$DEVICE" \
            out_dir="$WORK/profile_$precision" precision=$precision \
            'model={n_layer: 12, n_head: 12, n_embd: 768, vocab_size: 50304, block_size: 1024}' train.batch_size=8 \
            train.sequence_length=1024 train.total_batch_size=8192 train.num_iterations=4 train.val_loss_every=0 \
            train.sample_every=0 train.save_every=0 profile.start_step=2 profile.num_steps=1 > "$WORK/profile.log" 2>&1
        echo "profile $precision rc=$? $(( $(date +%s) - t ))s" >> "$LOG/summary.txt"
        { echo "===== $precision"; grep "^step\|GPU memory" -A2 "$WORK/profile.log" | head -20
          head -60 "$WORK/profile_$precision/profile/ops.txt"; tail -5 "$WORK/profile.log"; } >> "$LOG/profile.txt" 2>&1
    done
fi

echo "----- summary ($(( $(date +%s) - start ))s)"
cat "$LOG/summary.txt"
grep -h "^FAILED\|^ERROR" "$LOG/tests.log" "$LOG/ops.log" 2>/dev/null | cut -c1-220 | head -60
grep -B2 -A12 "Traceback\|Error" "$LOG/runs.log" 2>/dev/null | cut -c1-220 | head -80
