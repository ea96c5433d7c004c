"""Damaged archives give one clear error or a well-defined partial result: never a crash, a
hang, a traceback or unbounded memory (the corpus generator is tests/analyze/corpus.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from analyze import native_reader
from tests.analyze import corpus

CI_CORPUS = 400  # mutants per reader in CI; `python -m tests.analyze.corpus --count N` for more

# the native reader is part of the normal install; its own tests fail when it is not built
READERS = ["python"] + (["native"] if native_reader.available() else [])


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
    from analyze import otf2_reader

    defs, chunks = otf2_reader.read(_ours(tmp_path))
    defs.locations[0].events = 2
    with pytest.raises(otf2_reader.ReaderError, match="more events than the 2 its definition declares"):
        list(chunks)


@pytest.mark.skipif(not native_reader.available(), reason="covered where the extension is built")
def test_native_reader_stops_at_more_events_than_declared(tmp_path: Path) -> None:
    from analyze import _otf2native

    anchor = _ours(tmp_path)
    defs = native_reader._definitions(anchor)
    loc = defs.locations[0]
    reader = _otf2native.Reader(str(anchor), [loc.location_id], [loc.rank], defs.global_offset,
                                defs.resolution, [2])
    with pytest.raises(_otf2native.Error, match="more events than the 2 its definition declares"):
        reader.read(1000)
    reader.close()
    assert loc.events > 2
