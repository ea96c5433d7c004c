"""Declares the optional native OTF2 codec ``traceio._otf2native``; pyproject.toml has the rest.

The extension compiles against the OTF2 (>= 3.0) headers and library that ``make setup``
installs (Debian's libopen-trace-format2-dev, found through pkg-config) or against an OTF2
found through ``otf2-config`` (Score-P installations on clusters; ``OTF2_CONFIG=/path/to/otf2-config``
picks one). Without a usable OTF2 the build is skipped with a warning and dltrace runs its
pure-Python reader and writer instead (``analyze`` says so in one line).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup

NATIVE = Path("traceio") / "native"


def _run(*cmd: str) -> list[str] | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return shlex.split(out)


def _otf2_flags() -> tuple[list[str], list[str]] | None:
    """(compile flags, link flags) for OTF2, or None when no OTF2 installation is found."""
    config = os.environ.get("OTF2_CONFIG") or shutil.which("otf2-config")
    if config:
        cflags, ldflags, libs = (_run(config, flag) for flag in ("--cppflags", "--ldflags", "--libs"))
        if cflags is not None and ldflags is not None and libs is not None:
            return cflags, ldflags + libs
    if shutil.which("pkg-config"):
        cflags, libs = _run("pkg-config", "--cflags", "otf2"), _run("pkg-config", "--libs", "otf2")
        if cflags is not None and libs is not None:
            return cflags, libs
    for prefix in ("/usr", "/usr/local"):
        if (Path(prefix) / "include" / "otf2" / "otf2.h").is_file():
            return [f"-I{prefix}/include"], ["-lopen-trace-format2"]
    return None


def _extensions() -> list[Extension]:
    flags = _otf2_flags()
    if flags is None:
        print("dltrace: no OTF2 installation found (otf2-config, pkg-config otf2 or "
              "/usr/include/otf2); skipping the native OTF2 codec", file=sys.stderr)
        return []
    cflags, ldflags = flags
    # An OTF2 outside the loader's default paths (otf2-config on clusters) must be found at run time.
    rpath = [f[2:] for f in ldflags if f.startswith("-L") and not f.startswith("-L/usr/lib")]
    return [Extension(
        "traceio._otf2native",
        sources=[str(NATIVE / f) for f in ("module.c", "reader.c", "writer.c", "replay.c", "parquet.c", "parquet_read.c", "sweep.c")],
        depends=[str(NATIVE / "otf2native.h")],
        extra_compile_args=[*cflags, "-O3", "-Wall", "-Wno-unused-parameter"],
        extra_link_args=ldflags,
        runtime_library_dirs=rpath,
        optional=True,  # a failed build leaves the pure-Python reader and writer
    )]


setup(ext_modules=_extensions())
