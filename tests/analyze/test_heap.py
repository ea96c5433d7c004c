"""The ``analyze`` command keeps the memory it frees (analyze/heap.py): a block freed and
allocated again is not faulted in again. Each case runs in a fresh interpreter, since the
settings stay with the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import analyze.cli
from analyze import heap

glibc = pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
                           reason="the settings are glibc's")

# Allocate a 16 MiB block (under the 32 MiB threshold), write it, free it, and again: the page
# faults of each round, as the kernel counts them.
ROUNDS = """
import json, resource, sys
from analyze import heap
tuned = heap.keep_freed_memory() if sys.argv[1] == "tuned" else None
import numpy as np
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.ones(2 << 20, np.int64)  # 16 MiB, every page written
    del block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": tuned, "faults": faults}))
"""


def _rounds(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return json.loads(out.stdout)


@glibc
def test_a_freed_block_is_reused_without_faults() -> None:
    default, tuned = _rounds("default"), _rounds("tuned")
    assert tuned["tuned"] is True
    first = default["faults"][0]  # (huge pages where the kernel gives them: fewer faults)
    assert first > 0, default
    # glibc's defaults: a block this big is mapped for itself and unmapped when freed, so the
    # second round faults its pages in again (only then does the mmap threshold rise)
    assert default["faults"][1] > first // 2, default
    # kept: the second round reuses the first round's pages
    assert tuned["faults"][1] < tuned["faults"][0] // 10, tuned


def test_the_command_keeps_freed_memory_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append("heap") or True)
    real = analyze.cli.build_parser

    def parser():  # type: ignore[no-untyped-def]
        calls.append("parse")
        return real()

    monkeypatch.setattr(analyze.cli, "build_parser", parser)
    with pytest.raises(SystemExit):
        analyze.cli.main(["--help"])
    assert calls[:2] == ["heap", "parse"]


def test_elsewhere_than_glibc_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "confstr", lambda name: None)  # musl, macOS: no glibc version
    assert heap.keep_freed_memory() is False
