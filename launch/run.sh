#!/usr/bin/env bash
# Start an infini_train script on N ranks with mpirun (one process per rank; one rank per GPU on GPU nodes).
#
#   launch/run.sh -n 2 examples/gpt2/train.py --config configs/gpt2_tiny_ddp.yaml
#   launch/run.sh -n 16 --hostfile launch/hostfile.example --ppn 8 examples/gpt2/train.py --config configs/gpt2_124m_ddp.yaml
#   launch/run.sh -n 2 --max-restarts 3 examples/gpt2/train.py ...   # relaunch with resume=auto after a failure
#   launch/run.sh --dry-run -n 4 script.py      # print the mpirun command instead of running it
#
# Options (before the script): -n|-np N (ranks, default 1), --hostfile|-f FILE (lines "host" or "host:slots",
# MPICH's format, converted for Open MPI; # comments and blank lines allowed), --ppn N (ranks per node),
# --max-restarts N (default 0), --dry-run, -h|--help. Everything from the script on goes to python.
#
# Exit status: the job's (mpirun passes on the ranks'). train.py exits 0 when the run finished, 75 when a signal
# stopped it after it wrote a checkpoint, anything else on a failure. With --max-restarts N a failure relaunches
# the same command with resume=auto appended (once), up to N times, logging "restart k/N after exit status S";
# 0 and 75 are never restarted. SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 sent to run.sh go to mpirun, which passes
# them to every rank (Open MPI's gets SIGUSR1: it kills ranks soon after a SIGTERM); nothing is restarted after
# that. A second signal is passed on as is (MPICH: a second Ctrl-C aborts at once). Bad arguments exit 2.
#
# Environment:
#   PYTHON       interpreter for the ranks (default: $VIRTUAL_ENV/bin/python, else python3 on PATH)
#   MPIRUN       launcher to use (default: the mpirun/mpiexec next to that python -- the MPICH the mpi extra
#                installs, which matches mpi4py -- else the first on PATH)
#   MPIRUN_ARGS  extra launcher arguments, e.g. "-bind-to core" (MPICH) or "--bind-to none" (Open MPI)
#
# MPICH and Open MPI differ; run.sh evens them out. Hostfile: MPICH reads "host:slots", Open MPI "host slots=N" (run.sh
# writes that for it). More ranks than slots: MPICH just starts them, Open MPI refuses unless --oversubscribe (run.sh
# adds it on one machine when -n exceeds the cores). Signals: MPICH's mpiexec passes SIGTERM, SIGINT and SIGUSR1 on to
# the ranks; Open MPI's passes SIGUSR1 (and SIGUSR2) on but answers SIGTERM/SIGINT by killing the ranks, so run.sh
# sends it SIGUSR1 instead. Environment: MPICH hands the ranks the whole environment, Open MPI only what -x names
# (run.sh exports the variables below, and MPI4PY_LIBMPI = this Open MPI's libmpi.so, so that mpi4py's wheel loads
# it rather than the MPICH wheel's). Open MPI refuses to run as root unless --allow-run-as-root (added for root).
#   OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS: default to cores / ranks-per-node, so ranks on a
#                node do not oversubscribe the cores with BLAS threads
#   NCCL_DEBUG   default WARN;  INFINI_TRAIN_COLLECTIVE_TIMEOUT (seconds, default 300) is passed through
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die() {  # one clear message, then the usage; exit status 2 (bad arguments)
    echo "run.sh: $*" >&2
    echo >&2
    usage >&2
    exit 2
}
log() { echo "[run.sh $(date '+%Y-%m-%d %H:%M:%S')] $*" >&2; }
is_count() { [[ "$1" =~ ^[0-9]{1,6}$ ]] && (( 10#$1 > 0 )); }   # a positive integer (no bash arithmetic errors)
is_uint() { [[ "$1" =~ ^[0-9]{1,6}$ ]]; }

check_hostfile() {  # "host" or "host:slots" lines, slots > 0; # comments and blank lines; at least one host
    local file="$1" line entry host slots n=0 hosts=0
    [[ -f "$file" && -r "$file" ]] || die "hostfile '$file' not found or unreadable"
    while IFS= read -r line || [[ -n "$line" ]]; do
        n=$(( n + 1 ))
        entry="${line%$'\r'}"
        entry="${entry#"${entry%%[![:space:]]*}"}"   # strip leading and trailing blanks
        entry="${entry%"${entry##*[![:space:]]}"}"
        [[ -z "$entry" || "$entry" == \#* ]] && continue
        host="${entry%%:*}"
        if ! [[ "$host" =~ ^[A-Za-z0-9._-]+$ ]]; then
            die "hostfile '$file' line $n: expected 'host' or 'host:slots', got '$line'"
        fi
        if [[ "$entry" == *:* ]]; then
            slots="${entry#*:}"
            is_count "$slots" || die "hostfile '$file' line $n: slots must be a positive integer, got '$line'"
        fi
        hosts=$(( hosts + 1 ))
    done < "$file"
    (( hosts > 0 )) || die "hostfile '$file' lists no hosts (expected lines 'host' or 'host:slots')"
}

nranks=1
hostfile=""
converted=""
ppn=""
max_restarts=0
dry_run=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --) shift; break ;;
        --*=*) opt="${1%%=*}"; val="${1#*=}"; shift; set -- "$opt" "$val" "$@"; continue ;;
        -n|-np|--hostfile|-f|-hostfile|--ppn|-ppn|--max-restarts)
            [[ $# -ge 2 ]] || die "option $1 expects a value" ;;&
        -n|-np) nranks="$2"; shift 2 ;;
        --hostfile|-f|-hostfile) hostfile="$2"; shift 2 ;;
        --ppn|-ppn) ppn="$2"; shift 2 ;;
        --max-restarts) max_restarts="$2"; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option '$1'" ;;
        *) break ;;
    esac
done
is_count "$nranks" || die "expected -n to be a positive number of ranks, got '$nranks'"
nranks=$(( 10#$nranks ))
if [[ -n "$ppn" ]]; then
    is_count "$ppn" || die "expected --ppn to be a positive number of ranks per node, got '$ppn'"
    ppn=$(( 10#$ppn ))
fi
is_uint "$max_restarts" || die "expected --max-restarts to be a number >= 0, got '$max_restarts'"
max_restarts=$(( 10#$max_restarts ))
if [[ -n "$hostfile" ]]; then check_hostfile "$hostfile"; fi
[[ $# -gt 0 ]] || die "expected a script to run, e.g. launch/run.sh -n 2 examples/gpt2/train.py"
if [[ "$1" != -* && ! -f "$1" ]]; then  # after "--", python options such as -m pkg.module are passed as they are
    if (( dry_run )); then echo "run.sh: note: script '$1' not found here" >&2
    else die "script '$1' not found (from $PWD)"; fi
fi

# ---- interpreter and launcher: the mpirun next to the active python first (it matches the mpi4py there)
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then PYTHON="$VIRTUAL_ENV/bin/python"
    else PYTHON="$(command -v python3 || command -v python || true)"; fi
fi
# a path; symlinks kept so that a venv's bin/ stays its bin/
resolved="$(command -v "${PYTHON:-python3}" || true)"
[[ -n "$resolved" ]] || die "python interpreter '${PYTHON:-python3}' not found (set PYTHON or activate a venv)"
PYTHON="$resolved"
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
    # mpi4py's wheel loads the MPICH wheel's library unless told otherwise: point it at this mpirun's Open MPI
    if [[ -z "${MPI4PY_LIBMPI:-}" && -z "${MPI4PY_MPIABI:-}" ]]; then
        ompi_info="$(dirname "$MPIRUN")/ompi_info" libdir=""
        if [[ -x "$ompi_info" ]]; then
            libdir="$("$ompi_info" --parsable --path libdir 2>/dev/null | sed -n 's/^path:libdir://p' || true)"
        fi
        if [[ -n "$libdir" && -e "$libdir/libmpi.so" ]]; then export MPI4PY_LIBMPI="$libdir/libmpi.so"; fi
    fi
    for var in OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS NCCL_DEBUG PYTHONUNBUFFERED PYTHONPATH PATH \
               LD_LIBRARY_PATH VIRTUAL_ENV MPI4PY_LIBMPI MPI4PY_MPIABI INFINI_TRAIN_COLLECTIVE_TIMEOUT \
               INFINI_TRAIN_EXIT_GRACE INFINI_TRAIN_NCCL_BLOCKING_WAIT INFINI_TRAIN_HANG_GRACE \
               INFINI_TRAIN_SLOW_RANK INFINI_TRAIN_HANG_RANK; do
        if [[ -n "${!var:-}" ]]; then args+=(-x "$var"); fi
    done
    # Open MPI refuses to start as root unless asked (containers often run as root)
    if (( EUID == 0 )) && [[ -z "${OMPI_ALLOW_RUN_AS_ROOT:-}" ]]; then args+=(--allow-run-as-root); fi
    if [[ -n "$hostfile" ]]; then  # Open MPI wants "host slots=N" where MPICH reads "host:N"
        converted="$(mktemp "${TMPDIR:-/tmp}/hostfile.XXXXXX")"
        if (( ! dry_run )); then trap 'rm -f "$converted"' EXIT; fi  # --dry-run keeps it for the printed command
        sed -E 's/^[[:space:]]*([^#[:space:]:]+):([0-9]+)[[:space:]]*$/\1 slots=\2/' "$hostfile" > "$converted"
        args+=(--hostfile "$converted")
    elif (( nranks > cores )); then args+=(--oversubscribe); fi
    if [[ -n "$ppn" ]]; then args+=(--map-by "ppr:$ppn:node"); fi
else  # MPICH hydra passes the whole environment to the ranks
    if [[ -n "$hostfile" ]]; then args+=(-f "$hostfile"); fi
    if [[ -n "$ppn" ]]; then args+=(-ppn "$ppn"); fi
fi
read -r -a extra <<< "${MPIRUN_ARGS:-}"

script_args=("$@")
cmd=("$MPIRUN" "${args[@]}" "${extra[@]}" "$PYTHON" -u)
echo "[run.sh] ${cmd[*]} ${script_args[*]}  (OMP_NUM_THREADS=$OMP_NUM_THREADS, $flavor)" >&2
if (( dry_run )); then
    printf '%q ' "${cmd[@]}" "${script_args[@]}"; echo
    exit 0
fi

# ---- run, forwarding stop signals, and relaunch after failures
# mpirun runs as a background job in its own process group (job control on), so a Ctrl-C in the terminal reaches
# run.sh alone and is passed on once, instead of hitting mpirun twice (for MPICH, twice means "abort now").
child=""
stop_signal=""
interrupted=0
forward() {  # $1: the signal run.sh received; sent on first, then logged (stderr may be a closed terminal)
    local send="$1" again="$stop_signal"
    interrupted=1
    if [[ -z "$again" ]]; then
        stop_signal="$1"
        if [[ "$flavor" == openmpi && "$1" != USR1 && "$1" != HUP ]]; then send=USR1; fi
    fi
    if [[ -n "$child" ]]; then kill -s "$send" "$child" 2>/dev/null || true; fi
    if [[ -z "$again" ]]; then
        log "received SIG$1: sending SIG$send to mpirun${child:+ (pid $child)} so the ranks checkpoint and stop;" \
            "no restart after this" || true
    else
        log "received SIG$1 again: sending it to mpirun${child:+ (pid $child)}" || true
    fi
}
for sig in TERM INT USR1 HUP; do trap "forward $sig" "$sig"; done

run_once() {  # run "$@" in the background and wait for it, across interruptions by the traps; sets $status
    local s
    status=""
    set -m
    if [[ -t 0 ]]; then "$@" < /dev/null & else "$@" & fi  # a background group must not read the terminal
    child=$!
    set +m
    while :; do
        interrupted=0
        wait "$child" 2>/dev/null && s=0 || s=$?
        if (( s == 127 )) && [[ -n "$status" ]]; then break; fi  # collected already: keep the status we had
        status=$s
        (( interrupted && s > 128 )) || break  # a trap interrupted the wait: the job is still running
    done
    child=""
}

has_resume_auto=0
for arg in "${script_args[@]}"; do
    if [[ "$arg" == resume=auto ]]; then has_resume_auto=1; fi
done
restarts=0
status=0
while :; do
    if [[ -n "$stop_signal" ]]; then status=$(( 128 + $(kill -l "$stop_signal") )); break; fi
    run_once "${cmd[@]}" "${script_args[@]}"
    if (( status == 0 || status == 75 )) || [[ -n "$stop_signal" ]] || (( restarts >= max_restarts )); then break; fi
    restarts=$(( restarts + 1 ))
    if (( ! has_resume_auto )); then script_args+=(resume=auto); has_resume_auto=1; fi
    log "restart $restarts/$max_restarts after exit status $status: ${cmd[*]} ${script_args[*]}"
done
if (( max_restarts > 0 && status != 0 && status != 75 )) && [[ -z "$stop_signal" ]]; then
    log "giving up after $restarts restart(s): exit status $status"
fi
exit "$status"
