"""Chrome trace JSON is written as its events come: the same bytes as one json.dumps, a long
run's events never held whole, and no file at the path until it is complete."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from traceio import chrome

HEADER = {"schemaVersion": 1, "distributedInfo": {"rank": 3, "world_size": 4}, "baseTimeNanoseconds": 5}


def events(n: int) -> Iterator[dict[str, object]]:
    for i in range(n):
        yield {"ph": "X", "name": f"op {i}", "pid": 0, "tid": 1, "ts": i, "dur": 0.5}


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_the_bytes_are_those_of_one_dumps(tmp_path: Path, name: str) -> None:
    n = 2 * chrome.DUMP_BATCH + 7
    path = chrome.dump(tmp_path / name, HEADER, events(n))
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if name.endswith(".gz") else raw.decode()
    assert text == json.dumps({**HEADER, "traceEvents": list(events(n))})
    assert '"rank": 3' in text  # the pattern Holistic Trace Analysis finds a file's rank by
    assert chrome.dump(tmp_path / "empty.json", HEADER, []).read_text().endswith('"traceEvents": []}')


def test_events_are_written_before_the_last_is_made(tmp_path: Path) -> None:
    seen = []

    def failing() -> Iterator[dict[str, object]]:
        yield from events(3 * chrome.DUMP_BATCH)
        seen.append((tmp_path / ".t.json.tmp").stat().st_size)
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        chrome.dump(tmp_path / "t.json", HEADER, failing())
    assert seen[0] > 2 * chrome.DUMP_BATCH * 50  # two batches on disk while the third was made
    assert not (tmp_path / "t.json").exists()  # never a partial file under the name
    assert not (tmp_path / ".t.json.tmp").exists()  # nor a half-written one left behind
