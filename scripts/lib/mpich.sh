# MPICH over a libfabric provider: the one place that says how the scripts
# launch MPICH (scripts/mpirun-unimem, scripts/bench-sendq; the Python
# benchmarks through scripts/lib/mpich.py). Sourced, not run:
#
#   . "$repo/scripts/lib/mpich.sh"
#   mpich_over_ofi shm          # exports MPICH's variables for that provider
#   mpich_launcher 2            # sets the array `launch`: mpiexec and its options
#   "${launch[@]}" ./app
#
# MPICH is the one of the MPICH wheel, in the repository's .venv/
# (scripts/mpi-setup).

mpich_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# mpich_ofi_vars PROVIDER: the variables, NAME=VALUE one a line. MPICH's
# CH4 OFI netmod over libfabric's PROVIDER, and MPICH's own shared-memory
# module off (MPIR_CVAR_NOLOCAL=1): without it, ranks of one host never use
# the provider.
mpich_ofi_vars() {
    printf '%s\n' "FI_PROVIDER=$1" MPIR_CVAR_CH4_NETMOD=ofi MPIR_CVAR_NOLOCAL=1
}

# mpich_over_ofi PROVIDER: exports them.
mpich_over_ofi() {
    local kv
    while IFS= read -r kv; do
        export "${kv?}"
    done < <(mpich_ofi_vars "$1")
}

# mpich_launcher RANKS [HOSTS]: Hydra's mpiexec for RANKS ranks, in the
# array `launch`. Without HOSTS, on this host, one rank per core
# (-bind-to core). With HOSTS (uh1:2,uh2:2), over the test hosts of
# scripts/testhosts: Hydra starts its proxies through
# scripts/testhost-launch (its ssh launcher) and they connect back to
# mpiexec on the bridge (-localhost 198.18.0.1); ranks are not bound to
# cores, since every test host's proxy would bind its first rank to core 0
# of the same machine.
mpich_launcher() {
    local ranks=$1 hosts=${2:-}
    if [ -n "$hosts" ]; then
        launch=("$mpich_repo/.venv/bin/mpiexec" -launcher ssh
            -launcher-exec "$mpich_repo/scripts/testhost-launch"
            -localhost 198.18.0.1 -hosts "$hosts" -n "$ranks")
    else
        launch=("$mpich_repo/.venv/bin/mpiexec" -n "$ranks" -bind-to core)
    fi
}
