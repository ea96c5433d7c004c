#!/usr/bin/env bash
# Set up everything dltrace needs on a fresh machine, from the project's own files:
#   - Debian packages: otf2-tools (otf2-print) and libopen-trace-format2-dev (OTF2 headers),
#     openmpi-bin and libopenmpi-dev (mpirun, and the MPI that mpi4py loads);
#   - a Python 3.11 virtual environment in .venv with the pinned packages from pyproject.toml
#     (torch 2.13.0 CPU, tensorflow-cpu 2.15.1, numpy 1.26.4, pandas, plotnine, duckdb, otf2);
#   - Horovod 0.28.1, built once per machine into a wheel cache (tools/build_horovod.sh).
# Re-running is cheap: each step is skipped while its inputs are unchanged.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
venv="${DLTRACE_VENV:-$here/.venv}"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3

say() { printf '[setup] %s\n' "$*"; }
# Tools' own chatter (apt, pip and the build backends' warnings) goes to a log; on a failure
# the log's tail is shown. A newcomer's terminal shows only our progress lines.
log="${TMPDIR:-/tmp}/dltrace-setup-$$.log"
quiet() {
    if ! "$@" >>"$log" 2>&1; then
        say "error: '$*' failed; the last lines of its output ($log):" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
}

# --- system packages -------------------------------------------------------------------
need_apt=()
command -v otf2-print >/dev/null 2>&1 || need_apt+=(otf2-tools)
[ -f /usr/include/otf2/otf2.h ] || need_apt+=(libopen-trace-format2-dev)
# Open MPI: `instrument run --launcher mpirun` and mpi4py (whose wheel loads this libmpi)
command -v mpicc >/dev/null 2>&1 || need_apt+=(openmpi-bin libopenmpi-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${need_apt[*]} (Debian packages)"
        quiet apt-get update -qq
        quiet env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
    elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
        say "installing ${need_apt[*]} with sudo"
        quiet sudo apt-get update -qq
        quiet sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
    else
        say "error: ${need_apt[*]} missing and no apt-get here; install OTF2 3.x (otf2-print and headers) and re-run" >&2
        exit 1
    fi
fi

# --- Python environment ----------------------------------------------------------------
if ! "$python_bin" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    say "error: dltrace needs Python >= 3.11 (found $("$python_bin" --version 2>&1)); set PYTHON=..." >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || { say "creating $venv"; "$python_bin" -m venv "$venv"; }
py="$venv/bin/python"

# Every extra: what `make test` runs needs them all (frameworks, MPI, clusters, test oracles).
EXTRAS="torch,tensorflow,horovod,mpi,cluster,dev"
stamp="$venv/.dltrace-setup"
# setup.py and traceio/native/ build the native OTF2 codec: a change there reinstalls (rebuilds) too
key="$(cat pyproject.toml tools/setup.sh setup.py traceio/native/*.[ch] | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
    say "installing Python packages (first time: a few minutes)"
    quiet "$py" -m pip install -q --upgrade pip
    # torch first and alone: 2.13.0 is the CPU build on this disk (other versions pull CUDA builds)
    quiet "$py" -m pip install -q "torch==2.13.0"
    quiet "$py" -m pip install -q -e ".[$EXTRAS]"
    say "built the native OTF2 codec: $("$py" -c 'from traceio import codec; print("yes" if codec.available() else "NO (" + codec.unavailable_reason() + ")")')"
    "$py" -c 'import torch, tensorflow, numpy, pandas, plotnine, duckdb, otf2' 2>/dev/null || {
        say "error: the Python packages did not install; see $log" >&2; exit 1; }
    echo "$key" > "$stamp"
else
    say "Python packages up to date"
fi

# --- Horovod (built once per machine, cached outside the clone) ------------------------
if [ -x tools/build_horovod.sh ] && [ "${DLTRACE_SKIP_HOROVOD:-0}" != 1 ]; then
    PATH="$venv/bin:$PATH" tools/build_horovod.sh "$py"
fi

rm -f "$log"
say "ready: $venv"
