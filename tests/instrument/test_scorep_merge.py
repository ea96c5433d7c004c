"""Merging per-rank experiments and side files into one archive, read back by ``analyze``.

Stand-ins for per-rank Score-P experiments are archives our own writer produces (tests/literal.py)
with Score-P's naming: user regions ``user:<name>`` with role FUNCTION and no collective
records. Each rank's archive runs on a clock of its own (offset, and for rank 1 also a rate
error), its side file on another, so a correct merge must use both maps to line ranks up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import analyze
from instrument.scorep import merge as scorep_merge
from instrument.tracer import merge
from instrument.tracer.spill import SpillWriter
from tests.conftest import SCOREP_FIXTURES
from tests.literal import write_literal
from traceio import records
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, Kind, Op, Role

MS = 1_000_000
REF0 = 1_000 * MS  # reference time of the run's start
# rank -> (archive clock at reference 0, archive ticks per reference ns); local clock offset
ARCHIVE_CLOCK = {0: (5_000 * MS, 1.0), 1: (2_000 * MS, 1.00002)}
LOCAL_SHIFT = {0: 0, 1: 777_000}  # local = reference + shift
# Side-file region table (ids are the indices), as a ScorepRecorder writes it.
SIDE_REGIONS = [(records.STEP, Role.FUNCTION), (records.CLOCK_SYNC, Role.ARTIFICIAL),
                ("torch.distributed.all_reduce", Role.COLL_ALL2ALL), (records.FORWARD, Role.FUNCTION),
                ("mpi4py.Comm.Allreduce", Role.COLL_ALL2ALL)]
STEP, SYNC, ALLREDUCE, FORWARD, MPI4PY = range(5)


def archive_t(rank: int, ref_ms: float) -> int:
    at0, rate = ARCHIVE_CLOCK[rank]
    return int(round(at0 + (REF0 + ref_ms * MS) * rate))


def local_t(rank: int, ref_ms: float) -> int:
    return int(REF0 + ref_ms * MS + LOCAL_SHIFT[rank])


def rank_timeline(rank: int) -> list[tuple[str, float, float]]:
    """(region, start ms, end ms) in reference time. Rank 1 computes 20 ms longer per step, so
    rank 0 waits 20 ms in each all-reduce (which ends at 90 ms into the step)."""
    arrive = 60 if rank == 0 else 80
    items = [("dltrace.clock_sync", -5, -4), ("dltrace.clock_sync", 251, 252)]
    for s in (0, 100):
        items += [("dltrace.step", s, s + 100), ("dltrace.forward", s, s + arrive),
                  ("__main__:train_step", s + 1, s + 50),
                  ("torch.distributed.all_reduce", s + arrive, s + 90)]
    if rank == 0:
        items.append(("dltrace.step", 200, 210))  # evaluation after the last step: discarded
    else:
        items.append(("__main__:setup", -50, -40))  # the archives start at different times
    return items


def write_rank(run_dir: Path, rank: int, side: bool = True) -> None:
    """The rank's stand-in experiment ``scorep/rank-NNNNN`` and its side file ``ranks/``."""
    items: list[tuple[Any, ...]] = []
    for name, start, end in rank_timeline(rank):
        full = name if ":" in name else "user:" + name  # Score-P's name for a user region
        items.append((0, full, archive_t(rank, start), archive_t(rank, end), {"role": "function"}))
    write_literal(run_dir / "scorep" / f"rank-{rank:05d}", items, hosts={0: f"node{rank}"})
    if not side:
        return
    rows = []
    for name, _start, end in rank_timeline(rank):
        if name == "torch.distributed.all_reduce":  # recorded just before the region's leave
            rows.append((local_t(rank, end - 0.01), 0, 4096, 4096, ALLREDUCE, 0, -1, 0, Kind.COLL_END, Op.ALLREDUCE))
    # a gradient bucket reduced asynchronously during the first forward pass
    rows.append((local_t(rank, 10), local_t(rank, 20), 64, 64, ALLREDUCE, 0, -1, 0xFFFF, Kind.ASYNC_COLL, Op.ALLREDUCE))
    if rank == 0:
        rows.append((local_t(rank, 210), 2, 0, 0, 0, -1, -1, 0, Kind.STEP_DISCARD, 0))
    writer = SpillWriter(run_dir / "ranks", rank)
    writer.append(np.array(rows, dtype=EVENT_DTYPE).tobytes())
    writer.write_meta({
        "rank": rank, "host": f"node{rank}", "status": "ok", "backend": "scorep",
        "regions": [{"name": n, "role": str(r)} for n, r in SIDE_REGIONS],
        "comms": [{"name": "WORLD", "members": [0, 1]}],
        "threads": ["main thread"], "thread_kinds": ["main"],
        "clock_samples": [{"label": label, "local_ns": local_t(rank, at), "offset_ns": -LOCAL_SHIFT[rank],
                           "rtt_ns": 20_000} for label, at in (("start", -4.5), ("end", 251.5))],
        "scorep_sync": [{"label": label, "enter_ns": local_t(rank, a), "leave_ns": local_t(rank, b)}
                        for label, a, b in (("start", -5, -4), ("end", 251, 252))],
        "start_realtime_ns": 1_700_000_000_000_000_000,
    })
    writer.close()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    for rank in (0, 1):
        write_rank(tmp_path, rank)
    return tmp_path


def merged(run_dir: Path, expected: int | None = 2):  # type: ignore[no-untyped-def]
    result = scorep_merge.collect(run_dir, expected_ranks=expected)
    write_archive(result.spec, run_dir)
    return result, analyze.open(run_dir)


def test_ranks_names_steps_and_clocks(run_dir: Path) -> None:
    result, db = merged(run_dir)
    assert [(s.rank, s.host, s.steps, s.status, s.complete) for s in result.ranks] == [
        (0, "node0", 2, "ok", True), (1, "node1", 2, "ok", True)]
    assert result.missing_ranks == []
    for s in result.ranks:
        assert s.extra["scorep_merge"] == {"clock": "clock sync regions", "collectives_attached": 2,
                                           "collectives_unmatched": 0}
    names = {n for (n,) in db.sql("SELECT DISTINCT name FROM regions JOIN intervals USING (region_id)").fetchall()}
    assert names == {"dltrace.step", "dltrace.tail", "dltrace.forward", "dltrace.clock_sync",
                     "torch.distributed.all_reduce", "__main__:train_step", "__main__:setup"}  # "user:" dropped
    # One location group per rank; both ranks' steps start together in reference time, although
    # their archives' clocks are 3 s apart and rank 1's runs 20 ppm fast.
    steps = db.sql("SELECT rank, step, start_ns, duration_ns FROM steps ORDER BY step, rank").fetchall()
    assert [(r, s) for r, s, _, _ in steps] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    for a, b in zip(steps[::2], steps[1::2], strict=True):
        assert abs(a[2] - b[2]) <= 1_000  # ns
    assert all(abs(d - 100 * MS) <= 10_000 for _, _, _, d in steps)


def test_collectives_and_phases_as_the_builtin_tracer_would_give(run_dir: Path) -> None:
    _, db = merged(run_dir)
    colls = db.sql("SELECT rank, op, is_async, count(*), sum(bytes_sent), min(ranks_matched) "
                   "FROM collectives GROUP BY ALL ORDER BY ALL").fetchall()
    assert colls == [(0, "allreduce", False, 2, 8192, 2), (0, "allreduce", True, 1, 64, 2),
                     (1, "allreduce", False, 2, 8192, 2), (1, "allreduce", True, 1, 64, 2)]
    waits = db.sql("SELECT rank, round(wait_ns / 1e6, 2) FROM collectives WHERE NOT is_async "
                   "ORDER BY rank, seq").fetchall()
    assert waits == [(0, 20.0), (0, 20.0), (1, 0.0), (1, 0.0)]
    phases = db.sql("SELECT rank, phase, round(sum(duration_ns) / 1e6, 1) FROM phases "
                    "WHERE duration_ns > 0 GROUP BY ALL ORDER BY ALL").fetchall()
    # rank 0 per step: 60 compute, 20 idle, 10 all-reduce, 10 compute; rank 1: 80 + 10 + 10
    assert phases == [(0, "allreduce", 20.0), (0, "compute", 140.0), (0, "idle", 40.0),
                      (1, "allreduce", 20.0), (1, "compute", 180.0)]


def test_without_side_files_names_and_clock_properties_still_work(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_rank(tmp_path, rank, side=False)
    result, db = merged(tmp_path)
    assert [s.extra["scorep_merge"]["clock"] for s in result.ranks] == ["clock properties"] * 2
    assert db.sql("SELECT rank, count(*) FROM steps GROUP BY rank ORDER BY rank").fetchall() == [
        (0, 3), (1, 2)]  # nothing says rank 0's third step was discarded
    assert db.sql("SELECT count(*) FROM collectives").fetchall() == [(0,)]


def test_a_missing_rank_is_reported(run_dir: Path) -> None:
    result, _ = merged(run_dir, expected=3)
    assert result.missing_ranks == [2] and not result.complete


def test_no_experiment_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(merge.MergeError, match="no Score-P experiment"):
        scorep_merge.collect(tmp_path)


def test_an_mpi_record_inside_the_region_is_not_counted_twice(tmp_path: Path) -> None:
    """mpi4py under an MPI experiment: Score-P's MPI_Allreduce record inside our region wins."""
    for rank in (0, 1):
        items = [(0, "user:dltrace.step", archive_t(rank, 0), archive_t(rank, 100)),
                 (0, "user:mpi4py.Comm.Allreduce", archive_t(rank, 50), archive_t(rank, 90)),
                 (0, "MPI_Allreduce", archive_t(rank, 51), archive_t(rank, 89), {"op": "allreduce", "bytes": 32})]
        write_literal(tmp_path / "scorep" / f"rank-{rank:05d}", items)
        writer = SpillWriter(tmp_path / "ranks", rank)
        writer.append(np.array([(local_t(rank, 89.9), 0, 32, 32, MPI4PY, 0, -1, 0, Kind.COLL_END, Op.ALLREDUCE)],
                               dtype=EVENT_DTYPE).tobytes())
        writer.write_meta({"status": "ok", "regions": [{"name": n, "role": str(r)} for n, r in SIDE_REGIONS],
                           "comms": [{"name": "WORLD", "members": [0, 1]}]})
        writer.close()
    result, db = merged(tmp_path)
    assert [s.extra["scorep_merge"]["collectives_attached"] for s in result.ranks] == [0, 0]
    rows = db.sql("SELECT r.name, c.bytes_sent FROM collectives c JOIN regions r USING (region_id) "
                  "ORDER BY c.rank").fetchall()
    assert rows == [("MPI_Allreduce", 32), ("MPI_Allreduce", 32)]
    role = db.sql("SELECT role FROM regions WHERE name = 'mpi4py.Comm.Allreduce'").fetchall()
    assert role == [("coll_all2all",)]  # our role is restored all the same


def test_real_score_p_mpi_experiment(tmp_path: Path) -> None:
    """Score-P 8.4, 4 ranks, one MPI_Bcast (see tests/fixtures/scorep/README.md); the
    CREATE_HANDLE / DESTROY_HANDLE records of MPI_Init and MPI_Finalize are dropped."""
    anchor = SCOREP_FIXTURES / "sstelements-bcast4" / "traces.otf2"
    result = scorep_merge.merge_archives([(anchor, 0)], {})
    assert [s.rank for s in result.ranks] == [0, 1, 2, 3]
    assert ("MPI_COMM_WORLD", [0, 1, 2, 3]) in result.spec.comms
    write_archive(result.spec, tmp_path)
    db = analyze.open(tmp_path)
    rows = db.sql("SELECT rank, op, root, bytes_sent, bytes_recv, ranks_matched FROM collectives "
                  "ORDER BY rank").fetchall()
    assert rows == [(0, "bcast", 0, 16384, 4096, 4), (1, "bcast", 0, 0, 4096, 4),
                    (2, "bcast", 0, 0, 4096, 4), (3, "bcast", 0, 0, 4096, 4)]
