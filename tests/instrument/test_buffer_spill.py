"""The event buffer and the per-rank spill files, on tiny literal event lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from instrument.tracer.buffer import EventBuffer
from instrument.tracer.spill import HEADER, SpillWriter, ranks_present, read_rank
from traceio.records import EVENT_DTYPE, Kind


def test_buffer_drains_when_full_and_keeps_order() -> None:
    batches: list[np.ndarray] = []
    buf = EventBuffer(16, lambda raw: batches.append(np.frombuffer(bytes(raw), EVENT_DTYPE)))
    for i in range(40):
        buf.append(i, Kind.ENTER, region=i % 3, loc=1)
    assert [len(b) for b in batches] == [16, 16]
    buf.flush()
    times = np.concatenate(batches)["time"]
    assert times.tolist() == list(range(40))
    assert np.concatenate(batches)["region"].tolist() == [i % 3 for i in range(40)]


def test_buffer_flushes_when_its_oldest_record_is_an_interval_old() -> None:
    sizes: list[int] = []
    buf = EventBuffer(1000, lambda raw: sizes.append(len(raw) // 48), flush_interval_ns=100)
    for t in (0, 10, 50, 99):
        assert not buf.append(t, Kind.ENTER)
    assert not buf.flush_if_due(99)
    assert buf.flush_if_due(100)  # 100 ns after the first record
    assert sizes == [4]
    assert not buf.flush_if_due(1_000)  # nothing left to write
    buf.append(150, Kind.ENTER)
    assert not buf.flush_if_due(249) and buf.flush_if_due(250)
    assert sizes == [4, 1]


def test_flush_without_the_lock_when_it_stays_taken() -> None:
    """What a signal handler does when it interrupted an append on its own thread."""
    written: list[int] = []
    buf = EventBuffer(100, lambda raw: written.append(len(raw) // 48))
    buf.append(1, Kind.ENTER)
    buf._lock.acquire()  # the interrupted append
    assert not buf.lock_free(0.01)
    buf.flush(timeout=0.01)
    assert written == [1]


def test_failing_sink_drops_records_but_keeps_running() -> None:
    errors: list[Exception] = []

    def sink(raw: memoryview) -> None:
        raise OSError(28, "No space left on device")

    buf = EventBuffer(16, sink, on_error=errors.append)
    for i in range(33):
        buf.append(i, Kind.ENTER)
    assert buf.dropped == 32 and len(errors) == 2
    assert len(buf) == 1


def test_spill_round_trip_and_partial_last_record(tmp_path: Path) -> None:
    w = SpillWriter(tmp_path, 3)
    recs = np.zeros(5, EVENT_DTYPE)
    recs["time"] = [1, 2, 3, 4, 5]
    recs["kind"] = Kind.ENTER
    w.write_meta({"regions": [{"name": "a", "role": "function"}]})
    w.append(recs.tobytes())
    w.close()
    got = read_rank(tmp_path, 3)
    assert got.records["time"].tolist() == [1, 2, 3, 4, 5]
    assert got.meta["regions"][0]["name"] == "a"
    assert ranks_present(tmp_path) == [3]
    # a rank killed during a write leaves part of a record: it is dropped, the rest kept
    evt = w.events_path
    evt.write_bytes(evt.read_bytes() + b"\x01" * 20)
    got = read_rank(tmp_path, 3)
    assert len(got.records) == 5 and got.dropped_bytes == 20


def test_spill_rejects_foreign_files(tmp_path: Path) -> None:
    from instrument.tracer.spill import SpillError

    SpillWriter(tmp_path, 0).write_meta({})
    (tmp_path / "rank-00000.evt").write_bytes(b"not ours at all")
    with pytest.raises(SpillError, match="not a dltrace spill file"):
        read_rank(tmp_path, 0)
    (tmp_path / "rank-00000.evt").write_bytes(HEADER[:8] + b"\x09\x00\x00\x00" + HEADER[12:])
    with pytest.raises(SpillError, match="another dltrace version"):
        read_rank(tmp_path, 0)
