#!/usr/bin/env bash
# A one-machine Slurm cluster for the tests: munged, slurmctld and slurmd as background daemons under DIR.
#
#   tests/cluster/slurm_up.sh DIR          # install the packages if missing, start, wait until the node is idle
#   tests/cluster/slurm_up.sh --stop DIR   # stop the daemons started in DIR (nothing is left running)
#
# Everything lives in DIR: slurm.conf, the munge key and socket, state, spool, pid and log files. Commands reach
# this cluster with SLURM_CONF=DIR/slurm.conf (the daemons pass it on to the jobs). One node (this machine, its
# CPUs as `slurmd -C` reports them) in one partition "debug"; sched/backfill; jobs may be requeued. The daemons
# run as root (as the tests do) and listen on free ports, so a cluster already running elsewhere is not touched.
# Exit status: 0 when the node is idle; 3 when the packages are missing and cannot be installed (the tests then
# skip, naming the reason on stderr); anything else is a failure (the daemons' logs are printed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
stop=0
if [[ "${1:-}" == --stop ]]; then stop=1; shift; fi
[[ $# -eq 1 ]] || { echo "usage: $0 [--stop] DIR" >&2; exit 2; }
mkdir -p "$1"
dir="$(cd "$1" && pwd)"

cluster_processes() {  # what runs with this cluster's SLURM_CONF: slurmstepd and the jobs' processes
    local entry
    for entry in /proc/[0-9]*; do
        [[ "${entry#/proc/}" == "$$" ]] && continue
        if { tr '\0' '\n' < "$entry/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$dir/slurm.conf"; then
            echo "${entry#/proc/}"
        fi
    done
}

stop_daemons() {  # the jobs, then slurmd, slurmctld and munged, then whatever a job left behind
    local name pid _
    if [[ -f "$dir/slurmctld.pid" ]]; then
        SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    fi
    for name in slurmd slurmctld munged; do
        [[ -f "$dir/$name.pid" ]] || continue
        pid="$(cat "$dir/$name.pid" 2>/dev/null || true)"
        rm -f "$dir/$name.pid"
        [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || continue
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    for pid in $(cluster_processes); do kill -KILL "$pid" 2>/dev/null || true; done
}
if (( stop )); then stop_daemons; exit 0; fi

"$here/install_packages.sh" slurm || exit $?

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

stop_daemons  # a previous cluster in the same DIR
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
host="$(hostname -s)"
node="$(slurmd -C | head -n 1)"   # NodeName=<host> CPUs=... Boards=... RealMemory=...
node="${node/RealMemory=*/}"       # no memory limits: every job may use the machine's memory
[[ -f "$dir/munge/munge.key" ]] || mungekey --create --keyfile="$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"

# Job ids unlike those of any other test cluster: MPICH names its shared-memory segments after the job step, and
# the segments of a rank killed by SIGKILL outlive it, so two clusters both counting from 1 would collide.
first_job_id=$(( (RANDOM * 32768 + RANDOM) % 60000000 + 1000 ))
cat > "$dir/slurm.conf" <<EOF
# written by tests/cluster/slurm_up.sh: a one-node cluster on this machine
ClusterName=infini-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
FirstJobId=$first_job_id
MinJobAge=600
InactiveLimit=0
KillWait=30
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

export SLURM_CONF="$dir/slurm.conf"
fail() {
    echo "slurm_up.sh: $*" >&2
    local log
    for log in munged slurmctld slurmd; do
        [[ -f "$dir/$log.log" ]] && { echo "--- $dir/$log.log" >&2; tail -n 30 "$dir/$log.log" >&2; }
    done
    stop_daemons
    exit 1
}
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed" \
    || fail "munged did not start"
slurmctld -c -f "$SLURM_CONF" || fail "slurmctld did not start"
slurmd -f "$SLURM_CONF" || fail "slurmd did not start"
for _ in $(seq 300); do
    state="$(sinfo --noheader --nodes="$host" --format=%T 2>/dev/null || true)"
    if [[ "$state" == idle ]]; then
        echo "slurm_up.sh: node $host idle; SLURM_CONF=$SLURM_CONF" >&2
        exit 0
    fi
    sleep 0.1
done
fail "node $host did not become idle in 30 s (sinfo: '${state:-no answer}')"
