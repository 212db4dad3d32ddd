#!/usr/bin/env bash
# Start an infini_train script on N ranks with mpirun (one process per rank; one rank per GPU on GPU nodes).
#
#   launch/run.sh -n 2 examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml
#   launch/run.sh -n 16 --hostfile launch/hostfile.example --ppn 8 examples/gpt2/train.py --config configs/gpt2_124m_ddp.yaml
#   launch/run.sh --dry-run -n 4 script.py      # print the mpirun command instead of running it
#
# Options (before the script): -n|-np N (ranks, default 1), --hostfile|-f FILE (MPICH "host:slots" lines; converted
# for Open MPI), --ppn N (ranks per node), --dry-run, -h|--help. Everything from the script on goes to python.
#
# Environment:
#   PYTHON       interpreter for the ranks (default: $VIRTUAL_ENV/bin/python, else python3 on PATH)
#   MPIRUN       launcher to use (default: the mpirun/mpiexec next to that python -- the MPICH the mpi extra
#                installs, which matches mpi4py -- else the first on PATH)
#   MPIRUN_ARGS  extra launcher arguments, e.g. "-bind-to core" (MPICH) or "--allow-run-as-root" (Open MPI)
#   OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS: default to cores / ranks-per-node, so ranks on a
#                node do not oversubscribe the cores with BLAS threads
#   NCCL_DEBUG   default WARN;  INFINI_TRAIN_COLLECTIVE_TIMEOUT (seconds, default 300) is passed through
set -euo pipefail

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }

nranks=1
hostfile=""
converted=""
ppn=""
dry_run=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        -n|-np) nranks="$2"; shift 2 ;;
        --hostfile|-f|-hostfile) hostfile="$2"; shift 2 ;;
        --ppn|-ppn) ppn="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        -*) echo "run.sh: unknown option $1 (see launch/run.sh --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "run.sh: expected a script to run, e.g. launch/run.sh -n 2 examples/gpt2/train.py" >&2
    exit 2
fi
if ! [[ "$nranks" =~ ^[0-9]+$ ]] || [[ "$nranks" -lt 1 ]]; then
    echo "run.sh: expected -n to be a positive number of ranks, got '$nranks'" >&2
    exit 2
fi
if [[ -n "$hostfile" && ! -r "$hostfile" ]]; then
    echo "run.sh: hostfile '$hostfile' not found or unreadable" >&2
    exit 2
fi

# ---- interpreter and launcher: the mpirun next to the active python first (it matches the mpi4py there)
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then PYTHON="$VIRTUAL_ENV/bin/python"
    else PYTHON="$(command -v python3 || command -v python)"; fi
fi
PYTHON="$(command -v "$PYTHON")"  # a path; symlinks kept so that a venv's bin/ stays its bin/
if [[ "$PYTHON" != /* ]]; then PYTHON="$PWD/$PYTHON"; fi  # remote nodes need an absolute path
if [[ -z "${MPIRUN:-}" ]]; then
    pybin="$(dirname "$PYTHON")"
    for candidate in "$pybin/mpirun" "$pybin/mpiexec" "$(command -v mpirun || true)" "$(command -v mpiexec || true)"; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then MPIRUN="$candidate"; break; fi
    done
fi
if [[ -z "${MPIRUN:-}" ]]; then
    echo "run.sh: no mpirun or mpiexec found next to $PYTHON or on PATH" >&2
    echo "HINT: pip install -e '.[mpi]' (mpi4py + MPICH) in the environment of $PYTHON" >&2
    exit 2
fi
if "$MPIRUN" --version 2>&1 | grep -qiE "open ?mpi|openrte"; then flavor=openmpi; else flavor=mpich; fi

# ---- per-rank environment
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)"
if [[ -n "$ppn" ]]; then per_node="$ppn"
elif [[ -n "$hostfile" ]]; then
    nodes="$(grep -cvE '^[[:space:]]*(#|$)' "$hostfile" || true)"
    per_node=$(( (nranks + ${nodes:-1} - 1) / ${nodes:-1} ))
else per_node="$nranks"; fi
threads=$(( cores / per_node )); (( threads >= 1 )) || threads=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}"
export MKL_NUM_THREADS="${MKL_NUM_THREADS:-$OMP_NUM_THREADS}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export PYTHONUNBUFFERED=1  # rank output appears as it is printed, not at exit
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's package, installed or not

# ---- launcher arguments
args=(-n "$nranks")
if [[ "$flavor" == openmpi ]]; then
    for var in OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS NCCL_DEBUG PYTHONUNBUFFERED PYTHONPATH PATH \
               LD_LIBRARY_PATH VIRTUAL_ENV INFINI_TRAIN_COLLECTIVE_TIMEOUT INFINI_TRAIN_NCCL_BLOCKING_WAIT; do
        if [[ -n "${!var:-}" ]]; then args+=(-x "$var"); fi
    done
    if [[ -n "$hostfile" ]]; then  # Open MPI wants "host slots=N" where MPICH reads "host:N"
        converted="$(mktemp "${TMPDIR:-/tmp}/hostfile.XXXXXX")"
        sed -E 's/^([^#[:space:]:]+):([0-9]+)/\1 slots=\2/' "$hostfile" > "$converted"
        args+=(--hostfile "$converted")
    elif (( nranks > cores )); then args+=(--oversubscribe); fi
    if [[ -n "$ppn" ]]; then args+=(--map-by "ppr:$ppn:node"); fi
else  # MPICH hydra passes the whole environment to the ranks
    if [[ -n "$hostfile" ]]; then args+=(-f "$hostfile"); fi
    if [[ -n "$ppn" ]]; then args+=(-ppn "$ppn"); fi
fi
read -r -a extra <<< "${MPIRUN_ARGS:-}"

cmd=("$MPIRUN" "${args[@]}" "${extra[@]}" "$PYTHON" -u "$@")
echo "[run.sh] ${cmd[*]}  (OMP_NUM_THREADS=$OMP_NUM_THREADS, $flavor)" >&2
if (( dry_run )); then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
if [[ -n "${converted:-}" ]]; then  # remove the converted hostfile once the job ends
    set +e
    "${cmd[@]}"
    status=$?
    rm -f "$converted"
    exit "$status"
fi
exec "${cmd[@]}"
