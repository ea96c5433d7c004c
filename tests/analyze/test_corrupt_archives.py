"""Damaged archives give one clear error or a well-defined partial result: never a crash, a
hang, a traceback or unbounded memory (the corpus generator is tests/analyze/corpus.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from analyze.readers import otf2_native
from tests.analyze import corpus, sanitizer

CI_CORPUS = 400  # mutants per reader in CI; `python -m tests.analyze.corpus --count N` for more

# the native reader is part of the normal install; its own tests fail when it is not built
READERS = ["python"] + (["native"] if otf2_native.available() else [])


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_mutated_archives_never_crash_or_hang(reader: str, tmp_path: Path) -> None:
    results = corpus.run(CI_CORPUS, seed=1, reader=reader, workdir=tmp_path)
    assert len(results) == CI_CORPUS
    bad = [f"mutant {r['index']} ({r['source']}, {r['detail']}): {r['outcome']}: {r['message']}"
           for r in results if r["outcome"] not in corpus.ACCEPTABLE]
    assert not bad, "\n".join(bad)
    outcomes = Counter(r["outcome"] for r in results)
    # the corpus exercises both ends: damage that is reported, damage that is read around
    assert outcomes["error"] > CI_CORPUS // 5 and outcomes["ok"] > CI_CORPUS // 5, outcomes
    errors = [r["message"] for r in results if r["outcome"] == "error"]
    assert all("traces.otf2" in m or "OTF2" in m for m in errors), errors[:3]


SANITIZED_CORPUS = 150  # mutants read by the sanitized native reader in CI (about 3x slower)


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The native reader built with ASan and UBSan; fails (not skips) where it cannot be built."""
    if not otf2_native.available():
        pytest.fail("the native reader is not built: run make setup")
    return sanitizer.build(tmp_path_factory.mktemp("sanitized"))


def _sanitized_python(code: str, so: Path) -> subprocess.CompletedProcess[str]:
    prelude = f"from tests.analyze import sanitizer; sanitizer.load(__import__('pathlib').Path({str(so)!r}))\n"
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=corpus.ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **sanitizer.environment()})


@pytest.mark.slow
def test_sanitizer_is_armed(sanitized: Path) -> None:
    """The job below can only pass honestly if a memory error would abort: check that one does."""
    proc = _sanitized_python(
        "import ctypes; from analyze.readers import otf2_native; assert otf2_native.available()\n"
        "from traceio import codec; assert codec.native().__file__ == " + repr(str(sanitized)) + "\n"
        "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p\n"
        "p = libc.malloc(16); ctypes.memset(p, 0, 32)\n", sanitized)
    assert proc.returncode != 0
    assert "heap-buffer-overflow" in sanitizer.summary(proc.stderr), proc.stderr[-2000:]


@pytest.mark.slow
def test_sanitized_native_reader_on_fixtures_and_corpus(sanitized: Path, tmp_path: Path) -> None:
    srcs = corpus.sources(tmp_path)
    for name, archive in srcs.items():  # undamaged archives read cleanly, ASan watching
        proc = _sanitized_python(
            "from analyze.tables.database import build\n"
            f"build({str(archive)!r}, db={str(tmp_path / (name + '.duckdb'))!r}, reader='native')\n",
            sanitized)
        assert proc.returncode == 0, f"{name}: {sanitizer.summary(proc.stderr) or proc.stderr[-2000:]}"
    results = corpus.run(SANITIZED_CORPUS, seed=2, reader="native", workdir=tmp_path, sanitized=sanitized)
    assert len(results) == SANITIZED_CORPUS
    bad = [f"mutant {r['index']} ({r['source']}, {r['detail']}): {r['outcome']}: {r['message']}"
           for r in results if r["outcome"] not in corpus.ACCEPTABLE]
    assert not bad, "\n".join(bad)


def test_mutants_are_reproducible(tmp_path: Path) -> None:
    srcs = corpus.sources(tmp_path)
    a = corpus.make(17, 3, srcs, tmp_path / "a")
    b = corpus.make(17, 3, srcs, tmp_path / "b")
    assert a == b
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files_a)


def _ours(tmp_path: Path) -> Path:
    return corpus.sources(tmp_path)["ours"] / "traces.otf2"


def test_python_reader_stops_at_more_events_than_declared(tmp_path: Path) -> None:
    """A damaged event file can decode as an endless run of events (seen in the corpus: mutant
    99 of seed 1, after 99 others in the same process); the definitions bound it."""
    from analyze.readers import otf2_python

    defs, chunks = otf2_python.read(_ours(tmp_path))
    defs.locations[0].events = 2
    with pytest.raises(otf2_python.ReaderError, match="more events than the 2 its definition declares"):
        list(chunks)


@pytest.mark.skipif(not otf2_native.available(), reason="covered where the extension is built")
def test_native_reader_stops_at_more_events_than_declared(tmp_path: Path) -> None:
    from traceio import _otf2native

    anchor = _ours(tmp_path)
    defs = otf2_native.definitions(anchor)
    loc = defs.locations[0]
    reader = _otf2native.Reader(str(anchor), [loc.location_id], [loc.rank], defs.global_offset,
                                defs.resolution, [2])
    with pytest.raises(_otf2native.Error, match="more events than the 2 its definition declares"):
        reader.read(1000)
    reader.close()
    assert loc.events > 2
