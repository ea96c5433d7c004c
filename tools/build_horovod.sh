#!/usr/bin/env bash
# Install Horovod 0.28.1 (Gloo, PyTorch, TensorFlow; CPU only) into a Python env.
#
# Usage: tools/build_horovod.sh PYTHON      e.g. tools/build_horovod.sh .venv/bin/python
#
# Horovod ships only an sdist, and building it takes ~10 minutes on 2 cores, so the
# built wheel is cached per machine in
#   ${DLTRACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dltrace}/wheels/horovod-<key>/
# where <key> hashes the horovod version, the python version/ABI, the torch and
# tensorflow versions found in PYTHON's env, and this script's own sha256.
# A cache hit only runs `pip install --no-deps <wheel>` (seconds).
#
# Build recipe (horovod 0.28.1 against current torch / TF 2.15):
#  - CMakeLists pin C++14, which current PyTorch headers reject -> patched to C++17;
#  - CMAKE_POLICY_VERSION_MINIMUM=3.5 so that CMake >= 4 accepts the old
#    cmake_minimum_required() calls of the bundled third-party code;
#  - build-time python deps: setuptools, wheel, packaging (no build isolation);
#    runtime deps (not installed here, --no-deps): cloudpickle, psutil, pyyaml, packaging.
set -euo pipefail

HOROVOD_VERSION=0.28.1

log() { printf '[horovod] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -eq 1 ]] || { echo "usage: $0 PYTHON" >&2; exit 2; }
PYTHON=$1
command -v "$PYTHON" >/dev/null 2>&1 || die "python not found: $PYTHON"
command -v flock >/dev/null 2>&1 || die "flock not found (util-linux)"

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
SCRIPT_SHA=$(sha256sum "$SCRIPT_PATH" | cut -d' ' -f1)

export TF_CPP_MIN_LOG_LEVEL=3  # keep TF's import chatter out of our output

# ---- identify the environment --------------------------------------------------
# Versions come from the installed distributions' metadata (what `import torch;
# torch.__version__` reports, e.g. 2.13.0+cpu / 2.15.1) without importing the
# frameworks, which would cost ~10 s on every (cache hit) run.
ENV_ID=$("$PYTHON" - <<'PY'
import importlib.metadata as md, sys, sysconfig
pd = md.packages_distributions()
def versions(mod):
    dists = sorted(set(pd.get(mod) or []))
    if not dists:
        sys.exit(f"[horovod] ERROR: {mod} is not installed in {sys.prefix} (install the project's deps first)")
    return ",".join(f"{d}=={md.version(d)}" for d in dists)
print("%d.%d-%s" % (sys.version_info[0], sys.version_info[1], sysconfig.get_config_var("SOABI") or sys.abiflags))
print(versions("torch"))
print(versions("tensorflow"))
PY
) || die "cannot determine the python/torch/tensorflow versions of $PYTHON"
{ read -r PY_ID; read -r TORCH_VERSION; read -r TF_VERSION; } <<<"$ENV_ID"
SCRIPTS_DIR=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')

# horovod's runtime deps are not installed by us (--no-deps): they belong in the
# project's own dependency list. Check up front rather than after a 10 min build.
"$PYTHON" -c 'import cloudpickle, psutil, yaml, packaging' 2>/dev/null \
    || die "horovod's runtime deps are missing in $PYTHON's env: need cloudpickle psutil pyyaml packaging"

# Horovod's build picks -march=native instruction sets (-mavx -mfma -mf16c): a wheel from one
# CPU type can die with SIGILL on another, so the CPU model and flags are part of the key
# (a cache in a home directory shared across a cluster's node types stays correct).
CPU_ID=$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) 2>/dev/null \
          | sha256sum | cut -c1-16)
KEY=$(printf 'horovod=%s\npython=%s\ntorch=%s\ntensorflow=%s\ncpu=%s\nscript=%s\n' \
        "$HOROVOD_VERSION" "$PY_ID" "$TORCH_VERSION" "$TF_VERSION" "$CPU_ID" "$SCRIPT_SHA" \
      | sha256sum | cut -c1-16)

CACHE_ROOT=${DLTRACE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dltrace}
WHEELS=$CACHE_ROOT/wheels
CACHE_DIR=$WHEELS/horovod-$KEY
mkdir -p "$WHEELS"

find_wheel() {
    compgen -G "$CACHE_DIR/horovod-${HOROVOD_VERSION}-*.whl" | head -n1 || true
}

# ---- build (once per machine), under a lock -----------------------------------
# The lock is held until this script exits: concurrent setups wait for one build
# instead of building twice, and do not pip-install into a venv at the same time.
BUILT_NOW=0
exec 9>"$WHEELS/horovod-$KEY.lock"
if ! flock -n 9; then
    log "another setup holds $WHEELS/horovod-$KEY.lock (building?); waiting for it ..."
    flock 9
fi
WHEEL=$(find_wheel)

if [[ -n $WHEEL ]]; then
    log "cache hit: $WHEEL"
else
    mkdir -p "$CACHE_DIR"
    rm -rf "$CACHE_DIR"/.tmp.*   # leftovers of an interrupted (killed) build
    TMP=$(mktemp -d "$CACHE_DIR/.tmp.XXXXXX")  # same filesystem -> mv is atomic
    trap 'rm -rf "$TMP"' EXIT
    trap 'exit 130' INT TERM HUP   # make sure the EXIT trap runs on ^C / kill
    BUILD_LOG=$CACHE_DIR/build.log
    : >"$BUILD_LOG"
    log "building horovod $HOROVOD_VERSION (takes ~10 min once per machine) ..."
    log "  python $PY_ID, torch $TORCH_VERSION, tensorflow $TF_VERSION, key $KEY"
    log "  log: $BUILD_LOG"
    start=$SECONDS

    build_fail() {
        log "build FAILED: $*; last 40 lines of $BUILD_LOG:"
        tail -n 40 "$BUILD_LOG" >&2
        exit 1
    }

    # --no-build-isolation: the build uses the env's own setuptools (+ packaging,
    # imported by horovod's setup.py) and, crucially, its torch and tensorflow.
    "$PYTHON" -c 'import setuptools, packaging' >>"$BUILD_LOG" 2>&1 \
        || build_fail "setuptools and packaging are needed to build horovod"

    "$PYTHON" -m pip download --no-binary :all: --no-deps -d "$TMP/sdist" \
        "horovod==$HOROVOD_VERSION" >>"$BUILD_LOG" 2>&1 \
        || build_fail "could not download the horovod sdist"
    SDIST=$(compgen -G "$TMP/sdist/horovod-$HOROVOD_VERSION.tar.gz" || true)
    [[ -n $SDIST ]] || build_fail "sdist horovod-$HOROVOD_VERSION.tar.gz not found after download"
    tar -xzf "$SDIST" -C "$TMP" >>"$BUILD_LOG" 2>&1 || build_fail "could not unpack $SDIST"
    SRC=$TMP/horovod-$HOROVOD_VERSION
    [[ -d $SRC ]] || build_fail "unexpected sdist layout"

    # C++14 -> C++17 (current PyTorch headers require C++17). The tensorflow
    # CMakeLists already selects 17 for TF >= 2.10; the bundled third_party code
    # (eigen, gloo, flatbuffers) is left alone.
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$SRC/$f" \
            || build_fail "patch pattern 'set(CMAKE_CXX_STANDARD 14)' not found in $f"
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/$f"
        echo "patched $f: C++14 -> C++17" >>"$BUILD_LOG"
    done

    mkdir -p "$TMP/dist"
    env HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_CPU_OPERATIONS=gloo \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        MAKEFLAGS="-j$(nproc 2>/dev/null || echo 2)" \
        "$PYTHON" -m pip wheel -v --no-build-isolation --no-deps -w "$TMP/dist" "$SRC" \
        >>"$BUILD_LOG" 2>&1 \
        || build_fail "pip wheel exited non-zero"

    BUILT=$(compgen -G "$TMP/dist/horovod-$HOROVOD_VERSION-*.whl" | head -n1 || true)
    [[ -n $BUILT ]] || build_fail "no wheel produced"
    mv "$BUILT" "$CACHE_DIR/"
    WHEEL=$CACHE_DIR/$(basename "$BUILT")
    rm -rf "$TMP"
    trap - EXIT
    BUILT_NOW=1
    log "built $WHEEL in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s"
fi

# ---- install + verify ----------------------------------------------------------
# --force-reinstall: a wheel built for other torch/TF versions has the same
# version number, and pip would otherwise keep it.
"$PYTHON" -m pip install --quiet --no-deps --force-reinstall "$WHEEL" \
    || die "pip install $WHEEL failed"

"$PYTHON" -c '
import horovod.torch as ht, horovod.tensorflow as htf
assert ht.gloo_built() and htf.gloo_built(), "horovod was built without Gloo"
' || die "horovod installed but 'import horovod.torch, horovod.tensorflow' fails"
[[ -x $SCRIPTS_DIR/horovodrun ]] || die "horovodrun not found in $SCRIPTS_DIR"

# `horovodrun --check-build` imports TF/torch in ~7 subprocesses (~30 s): run it
# after a fresh build (or when DLTRACE_HOROVOD_CHECK_BUILD=1), not on every cache hit.
if [[ $BUILT_NOW == 1 || ${DLTRACE_HOROVOD_CHECK_BUILD:-0} == 1 ]]; then
    CHECK=$(PATH="$SCRIPTS_DIR:$PATH" horovodrun --check-build 2>&1) \
        || { echo "$CHECK" >&2; die "horovodrun --check-build failed"; }
    for item in TensorFlow PyTorch Gloo; do
        grep -q "\[X\] $item" <<<"$CHECK" \
            || { echo "$CHECK" >&2; die "horovodrun --check-build does not list $item"; }
    done
    log "horovodrun --check-build: TensorFlow, PyTorch, Gloo OK"
fi
log "installed horovod $HOROVOD_VERSION (PyTorch, TensorFlow, Gloo) into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
