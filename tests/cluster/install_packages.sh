#!/usr/bin/env bash
# Install Debian's Slurm and Open MPI packages when they are missing (the cluster tests' only system packages).
#
#   tests/cluster/install_packages.sh slurm     # slurm-wlm, munge
#   tests/cluster/install_packages.sh openmpi   # openmpi-bin, libopenmpi-dev
#
# Exit status 0 when the commands are there (installed now or before), 3 when they are missing and cannot be
# installed here (not root, no apt-get, or apt-get failed): the reason is printed on stderr. Concurrent calls
# (pytest workers) take turns on a lock.
set -uo pipefail

case "${1:-}" in
    slurm) packages=(slurm-wlm munge); commands=(slurmctld slurmd sbatch munged mungekey) ;;
    openmpi) packages=(openmpi-bin libopenmpi-dev); commands=(mpirun.openmpi) ;;
    *) echo "usage: $0 slurm|openmpi" >&2; exit 2 ;;
esac
present() {
    local command
    for command in "${commands[@]}"; do command -v "$command" > /dev/null || return 1; done
}
present && exit 0
missing() { echo "install_packages.sh: ${packages[*]} missing and $*" >&2; exit 3; }
(( EUID == 0 )) || missing "this is not root (install them: sudo apt-get install ${packages[*]})"
command -v apt-get > /dev/null || missing "there is no apt-get here"

exec 9> /tmp/infini-train-apt.lock
flock 9
present && exit 0
log="$(mktemp)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${packages[@]}"; } > "$log" 2>&1; then
    tail -n 20 "$log" >&2
    rm -f "$log"
    missing "apt-get install failed (above)"
fi
rm -f "$log"
present || missing "their commands (${commands[*]}) are still not on PATH after apt-get install"
