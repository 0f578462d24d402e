"""MPICH over a libfabric provider, for the Python benchmark scripts.

The recipe itself (MPICH's variables, mpiexec and its options) is
scripts/lib/mpich.sh, the one place every script takes it from; this
module asks it:

    env = mpich.clean_env()
    env.update(mpich.ofi_env("shm"))
    subprocess.run(mpich.launcher(2) + ["./app"], env=env)
"""

import functools
import os
import subprocess

LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpich.sh")


@functools.lru_cache(maxsize=None)
def _ask(script, *args):
    """The lines a shell snippet prints after sourcing mpich.sh."""
    out = subprocess.run(["bash", "-c", f'. "$0"; {script}', LIB, *args],
                         check=True, capture_output=True, text=True).stdout
    return tuple(out.splitlines())


def clean_env():
    """This process's environment without its FI_* and MPIR_CVAR_*
    variables: a run sets its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("FI_", "MPIR_CVAR_"))}


def ofi_env(provider):
    """MPICH's variables for libfabric's `provider` (mpich_ofi_vars)."""
    return dict(line.split("=", 1) for line in _ask('mpich_ofi_vars "$1"', provider))


def launcher(ranks, hosts=""):
    """mpiexec and its options for `ranks` ranks, on this host or over the
    test hosts `hosts` (mpich_launcher)."""
    return list(_ask('mpich_launcher "$@"; printf "%s\\n" "${launch[@]}"', str(ranks), hosts))
