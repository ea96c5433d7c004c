"""The ``analyze`` command keeps the memory it frees (analyze/heap.py): a block freed and
allocated again is not faulted in again. Each case runs in a fresh interpreter, since the
settings stay with the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


# Warm the heap (128 MiB), then allocate and write four blocks of 16 MiB: their pages are there
# already.
WARMED = """
import json, resource, sys
from analyze import heap
heap.keep_freed_memory()
thread = heap.warm(int(sys.argv[1]) << 20)
if thread is not None:
    thread.join()
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):  # as the codec's buffers are (numpy asks the kernel for huge pages: fewer faults)
    ctypes.memset(libc.malloc(16 << 20), 1, 16 << 20)
print(json.dumps({"warmed": thread is not None,
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _warmed(mb: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WARMED, str(mb)], capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    return json.loads(out.stdout)


@glibc
def test_a_warmed_heap_gives_a_build_pages_without_faults() -> None:
    cold, warmed = _warmed(0), _warmed(128)
    assert not cold["warmed"] and warmed["warmed"]
    # 64 MiB: 16k pages of 4 KiB, less what the imports left free in the heap (fewer with huge pages)
    assert cold["faults"] > 4000, cold
    assert warmed["faults"] < cold["faults"] // 10, (cold, warmed)


def test_nothing_is_warmed_where_freed_memory_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_kept", False)
    assert heap.warm(64 << 20) is None


def _archive(run: Path, event_bytes: int) -> Path:
    """A run directory whose archive has event files of ``event_bytes`` (their contents do not
    matter to the sizing)."""
    (run / "traces").mkdir(parents=True)
    (run / "traces.otf2").write_text("anchor")
    for rank, size in enumerate((event_bytes // 2, event_bytes - event_bytes // 2)):
        (run / "traces" / f"{rank}.evt").write_bytes(b"\0" * size)
        (run / "traces" / f"{rank}.def").write_bytes(b"\0" * 1000)  # local definitions: not counted
    return run


def test_the_command_warms_the_heap_for_the_archive_it_will_build(tmp_path: Path) -> None:
    from analyze.cli import (
        WARM_MOST,
        WARM_PER_CORE,
        WARM_PER_EVENT_BYTE,
        build_parser,
        heap_to_warm,
    )

    run = _archive(tmp_path / "run", 3 << 20)
    parse = build_parser().parse_args
    want = WARM_PER_EVENT_BYTE * (3 << 20)
    assert heap_to_warm(parse(["phases", str(run)])) == want
    assert heap_to_warm(parse(["phases", str(run / "traces.otf2")])) == want  # the anchor itself
    assert heap_to_warm(parse(["phases", str(run), "--engine", "dask"])) == 0  # the workers build
    assert heap_to_warm(parse(["report", str(tmp_path / "missing"), str(run)])) == want  # the largest run
    # a database newer than the archive is most likely current: nothing to build
    db = run / "trace.duckdb"
    db.write_text("")
    os.utime(db, ns=(run.joinpath("traces.otf2").stat().st_mtime_ns + 10**9,) * 2)
    assert heap_to_warm(parse(["phases", str(run)])) == 0
    assert heap_to_warm(parse(["phases", str(run), "--force"])) == want
    assert heap_to_warm(parse(["phases", str(run), "--db", str(tmp_path / "other.duckdb")])) == want
    # a large archive: at most what the read tasks hold at once, per core
    big = _archive(tmp_path / "big", 1 << 30)
    cores = len(os.sched_getaffinity(0))
    assert heap_to_warm(parse(["phases", str(big)])) == min(WARM_PER_CORE * cores, WARM_MOST)
    assert heap.SETTINGS[-1][1] > WARM_MOST  # kept when freed: under the trim threshold
    # Chrome trace JSON (the Python reader) and verbs without a run: nothing
    (tmp_path / "kineto").mkdir()
    (tmp_path / "kineto" / "rank0.pt.trace.json").write_text("{}")
    assert heap_to_warm(parse(["phases", str(tmp_path / "kineto")])) == 0
    assert heap_to_warm(parse(["compare", str(tmp_path)])) == 0
