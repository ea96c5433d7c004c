"""Tracer -> spill files -> merge -> OTF2, read back with the otf2 package."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import otf2
import pytest

from instrument.tracer import merge
from instrument.tracer.builtin import Tracer
from traceio import records
from traceio.otf2_writer import write_archive
from traceio.records import Op, Role


class Clock:
    """A clock the test sets by hand."""

    def __init__(self) -> None:
        self.t = 1_000

    def now(self) -> int:
        return self.t


def read_back(anchor: Path) -> list[tuple[str, str, int, str]]:
    """(rank group, event type, time, detail) for every event, in reading order."""
    out = []
    with otf2.reader.open(str(anchor)) as r:
        for loc, ev in r.events:
            detail = ""
            if hasattr(ev, "region"):
                detail = ev.region.name
            elif type(ev).__name__ == "MpiCollectiveEnd":
                detail = f"{ev.communicator.name}:{ev.size_sent}"
            out.append((f"{loc.group.name}/{loc.name}", type(ev).__name__, ev.time, detail))
    return out


def traced_rank(run: Path, rank: int, start: int, steps: int = 2) -> Tracer:
    clock = Clock()
    clock.t = start
    tr = Tracer(rank, 2, run, clock=clock, capacity=16, flush_interval_s=None)
    fwd, opt = tr.region_id(records.FORWARD), tr.region_id(records.OPTIMIZER)
    ar = tr.region_id("torch.distributed.all_reduce", Role.COLL_ALL2ALL)
    comm = tr.comm_id("WORLD", (0, 1))
    for _ in range(steps):
        tr.enter(fwd)
        clock.t += 100
        tr.leave(fwd)
        tr.enter(ar)
        clock.t += 50
        tr.collective_end(clock.t, comm, Op.ALLREDUCE, -1, 4096, 4096)
        tr.leave(ar)
        tr.async_collective(ar, clock.t - 40, clock.t + 30, comm, Op.ALLREDUCE, -1, 8, 8)
        tr.async_collective(ar, clock.t - 20, clock.t + 10, comm, Op.ALLREDUCE, -1, 8, 8)
        tr.enter(opt)
        clock.t += 20
        tr.leave(opt)
        tr.optimizer_done()
        clock.t += 5
    return tr


def test_round_trip(tmp_path: Path) -> None:
    for rank in (0, 1):
        traced_rank(tmp_path, rank, start=1_000 + 7 * rank).finalize("ok")
    result = merge.collect(tmp_path, expected_ranks=2)
    assert result.complete and [s.steps for s in result.ranks] == [2, 2]
    anchor = write_archive(result.spec, tmp_path)
    evs = read_back(anchor)
    main0 = [(k, t, d) for loc, k, t, d in evs if loc == "rank 0/main thread"]
    # the first step, exactly as recorded (flush regions of the 16-record buffer aside)
    body = [e for e in main0 if e[2] != "dltrace.flush"]
    assert body[:10] == [
        ("Enter", 1000, "dltrace.step"), ("Enter", 1000, "dltrace.forward"),
        ("Leave", 1100, "dltrace.forward"), ("Enter", 1100, "torch.distributed.all_reduce"),
        ("MpiCollectiveBegin", 1100, ""), ("MpiCollectiveEnd", 1150, "WORLD:4096"),
        ("Leave", 1150, "torch.distributed.all_reduce"), ("Enter", 1150, "dltrace.optimizer"),
        ("Leave", 1170, "dltrace.optimizer"), ("Leave", 1170, "dltrace.step"),
    ]
    # two overlapping asynchronous collectives per step go onto two lanes
    lanes = sorted({loc for loc, *_ in evs if "comm lane" in loc})
    assert lanes == ["rank 0/comm lane 0", "rank 0/comm lane 1", "rank 1/comm lane 0", "rank 1/comm lane 1"]
    lane0 = [(k, t) for loc, k, t, _ in evs if loc == "rank 0/comm lane 0"]
    assert lane0[:4] == [("Enter", 1110), ("MpiCollectiveBegin", 1110), ("MpiCollectiveEnd", 1180), ("Leave", 1180)]
    # Enter and Leave balance on every location
    for loc in {e[0] for e in evs}:
        kinds = [k for lo, k, _, _ in evs if lo == loc]
        assert kinds.count("Enter") == kinds.count("Leave"), loc


def test_otf2_print_reads_our_archive(tmp_path: Path) -> None:
    traced_rank(tmp_path, 0, 1000).finalize("ok")
    traced_rank(tmp_path, 1, 1000).finalize("ok")
    anchor = write_archive(merge.collect(tmp_path).spec, tmp_path)
    tool = shutil.which("otf2-print")
    assert tool, "otf2-print not found: the setup installs Debian's otf2-tools (make setup)"
    proc = subprocess.run([tool, str(anchor)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "MPI_COLLECTIVE_END" in proc.stdout and "dltrace.step" in proc.stdout


def test_clock_offsets_are_interpolated_by_readers(tmp_path: Path) -> None:
    for rank in (0, 1):
        tr = traced_rank(tmp_path, rank, 1000, steps=1)
        tr.finalize("ok")
    spec = merge.collect(tmp_path).spec
    # rank 1's clock is 1000 ns behind at local 1000 and 4000 ns behind at local 4000
    spec.ranks[1].clock_offsets = [(1000, 1000, 0.0), (4000, 4000, 0.0)]
    anchor = write_archive(spec, tmp_path)
    evs = read_back(anchor)
    first = [t for loc, k, t, d in evs if loc == "rank 1/main thread" and d == "dltrace.forward"]
    # local 1000 -> 2000; local 1100 -> 1100 + 1100 = 2200 (linear between the records)
    assert first == [2000, 2200]


def test_killed_rank_is_closed_and_flagged(tmp_path: Path) -> None:
    tr = traced_rank(tmp_path, 0, 1000, steps=1)
    tr.finalize("ok")
    clock = Clock()
    killed = Tracer(1, 2, tmp_path, clock=clock, capacity=16, flush_interval_s=None)
    fwd = killed.region_id(records.FORWARD)
    killed.enter(fwd)
    clock.t = 1500
    killed.enter(killed.region_id("inner"))
    killed.buffer.flush()  # what a periodic flush leaves before SIGKILL: no finalize
    result = merge.collect(tmp_path, expected_ranks=3)
    r1 = result.ranks[1]
    assert r1.status == "running" and r1.open_regions_closed == 3 and not r1.complete
    assert result.missing_ranks == [2] and not result.complete
    evs = read_back(write_archive(result.spec, tmp_path))
    r1_events = [(k, t, d) for loc, k, t, d in evs if loc.startswith("rank 1/main")]
    assert r1_events[-3:] == [("Leave", 1500, "inner"), ("Leave", 1500, "dltrace.forward"),
                              ("Leave", 1500, "dltrace.step")]


def test_trailing_partial_step_becomes_tail(tmp_path: Path) -> None:
    tr = traced_rank(tmp_path, 0, 1000, steps=1)
    fwd = tr.region_id(records.FORWARD)
    tr.enter(fwd)
    tr.leave(fwd)
    tr.finalize("ok")
    result = merge.collect(tmp_path)
    assert result.ranks[0].steps == 1
    names = [d for _, k, _, d in read_back(write_archive(result.spec, tmp_path)) if k == "Enter"]
    assert names.count("dltrace.step") == 1 and names.count("dltrace.tail") == 1


def test_no_rank_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(merge.MergeError, match="no per-rank trace files"):
        merge.collect(tmp_path)


def test_activity_after_the_last_optimizer_step_leaves_a_complete_rank(tmp_path: Path) -> None:
    """A collective after the last step (a final barrier) opens a step that finalize closes:
    the rank is complete, the trailing step is a tail."""
    tr = traced_rank(tmp_path, 0, 1000, steps=1)
    barrier = tr.region_id("torch.distributed.barrier", Role.BARRIER)
    tr.enter(barrier)
    tr.finalize("ok")
    result = merge.collect(tmp_path, expected_ranks=1)
    assert result.ranks[0].open_regions_closed == 0 and result.complete
    names = [d for _, k, _, d in read_back(write_archive(result.spec, tmp_path)) if k == "Enter"]
    assert names.count("dltrace.step") == 1 and names.count("dltrace.tail") == 1
