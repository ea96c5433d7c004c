"""The native OTF2 reader built with AddressSanitizer and UndefinedBehaviorSanitizer.

    .venv/bin/python -m tests.analyze.corpus --reader native --sanitize --count 1000

:func:`build` compiles the same extension the setup builds (``setup.py``, same sources and
OTF2 flags) with ``-fsanitize=address,undefined`` into a directory of its own; the corpus
worker loads that file as ``traceio._otf2native`` (:func:`load`) in a Python started with the
sanitizer runtimes preloaded (:func:`environment`). Any finding aborts the process, which the
corpus records as a ``crash`` with the sanitizer's summary line. Python, DuckDB and the OTF2
library are not instrumented: what is checked is our C code and the memory it touches.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"


class SanitizerUnavailable(RuntimeError):
    pass


def runtimes() -> list[str]:
    """Paths of the compiler's ASan and UBSan runtime libraries (to preload into Python)."""
    paths = []
    for lib in ("libasan.so", "libubsan.so"):
        try:
            path = subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True,
                                  check=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            raise SanitizerUnavailable(f"gcc is needed for the sanitizer build: {e}") from None
        if not os.path.isabs(path):  # gcc echoes the bare name when it has no such library
            raise SanitizerUnavailable(f"gcc has no {lib} (Debian: apt-get install libasan8 libubsan1)")
        paths.append(path)
    return paths


def build(dest: Path) -> Path:
    """Compile the sanitized extension under ``dest``; the path of the shared object."""
    env = {**os.environ, "CFLAGS": FLAGS, "LDFLAGS": "-fsanitize=address,undefined"}
    proc = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(dest / "lib"),
         "--build-temp", str(dest / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    built = sorted((dest / "lib" / "traceio").glob("_otf2native*.so"))
    if proc.returncode != 0 or not built:
        raise SanitizerUnavailable(f"the sanitized build failed:\n{proc.stdout}{proc.stderr}")
    return built[0]


def environment() -> dict[str, str]:
    """Variables for a Python process that loads the sanitized extension."""
    return {
        "LD_PRELOAD": " ".join(runtimes()),
        # Python's allocations at exit are not leaks of ours; every finding aborts the process
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1:abort_on_error=1",
    }


def load(shared_object: Path) -> None:
    """Make ``import traceio._otf2native`` give the sanitized build (before ``analyze`` loads it)."""
    spec = importlib.util.spec_from_file_location("traceio._otf2native", shared_object)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["traceio._otf2native"] = module


def summary(log: str) -> str:
    """The sanitizer's one-line verdict in a process's stderr ("" when it found nothing)."""
    found = [line for line in log.splitlines()
             if line.startswith("SUMMARY:") or "runtime error:" in line]
    return found[0].strip() if found else ""
