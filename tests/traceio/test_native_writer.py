"""The native writer writes the otf2 package's archive byte for byte, and the merge's C loops
give the Python loops' records."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import analyze
from instrument.tracer import merge
from instrument.tracer.builtin import Tracer
from tests.instrument.test_merge import Clock, traced_rank
from traceio import codec
from traceio.archive import ArchiveSpec, LocationSpec, RankSpec
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, NO_LOC, Kind, Op

pytestmark = pytest.mark.skipif(not codec.available(), reason="native writer not built")


def files(run: Path) -> dict[str, bytes]:
    """Every file of the archive in ``run`` by relative path; for the anchor file, what
    otf2-print shows of it but the library version and the random trace identifier."""
    out = {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    tool = shutil.which("otf2-print")
    assert tool, "otf2-print not found: the setup installs Debian's otf2-tools (make setup)"
    anchor = subprocess.run([tool, "-I", "--silent", str(run / "traces.otf2")],
                            capture_output=True, text=True, timeout=60).stdout
    out["traces.otf2"] = "\n".join(line for line in anchor.splitlines()
                                   if not line.startswith(("Version", "Trace identifier"))).encode()
    return out


def mixed_spec(seed: int) -> ArchiveSpec:
    """Every record kind the writer translates (and one it skips), two hosts, a rank with a
    communication lane, clock offsets, two communicators."""
    rng = np.random.default_rng(seed)
    ranks = []
    for rank in range(3):
        locations = []
        for index, kind in enumerate(["main", "comm_lane"][: 1 + (rank != 1)]):
            n = 300
            recs = np.zeros(n, dtype=EVENT_DTYPE)
            recs["time"] = 5_000 + np.cumsum(rng.integers(0, 40, n))
            recs["kind"] = rng.choice([Kind.ENTER, Kind.LEAVE, Kind.COLL_BEGIN, Kind.COLL_END, Kind.SEND,
                                       Kind.RECV, Kind.STEP_DISCARD], n)
            recs["region"] = rng.integers(0, 4, n)
            recs["comm"] = rng.integers(-1, 2, n)  # -1: the last communicator, as list indexing
            recs["root"] = rng.integers(-1, 3, n)
            recs["root"][np.isin(recs["kind"], (Kind.SEND, Kind.RECV))] %= 3
            recs["op"] = rng.choice([int(o) for o in Op], n)
            recs["bytes_sent"] = rng.integers(0, 1 << 50, n)
            recs["bytes_recv"] = rng.integers(0, 1 << 50, n)
            recs["aux"] = rng.integers(0, 1000, n)
            recs["loc"] = index
            locations.append(LocationSpec(rank, index, f"loc {index}", kind, recs))
        offsets = [] if rank == 0 else [(5_000, 100 * rank, 1.5), (9_000, -40 * rank, 2.5)]
        ranks.append(RankSpec(rank, f"host{rank // 2}", offsets, locations))
    regions = [("dltrace.step", "function"), ("flush", "artificial"), ("all_reduce", "coll_all2all"),
               ("wait", "wait")]
    return ArchiveSpec(regions, [("WORLD", [0, 1, 2]), ("sub", [2, 0])], ranks,
                       start_realtime_ns=1_700_000_000_987_654_321, creator="dltrace test")


@pytest.mark.parametrize("seed", range(3))
def test_same_bytes_as_the_otf2_package(seed: int, tmp_path: Path) -> None:
    spec = mixed_spec(seed)
    write_archive(spec, tmp_path / "python", writer="python")
    write_archive(spec, tmp_path / "native", writer="native")
    python, native = files(tmp_path / "python"), files(tmp_path / "native")
    assert sorted(native) == sorted(python)
    for name in python:
        assert native[name] == python[name], name


def test_merged_run_same_bytes_and_otf2_print_reads_it(tmp_path: Path) -> None:
    for rank in (0, 1):
        traced_rank(tmp_path, rank, start=1_000 + 7 * rank).finalize("ok")
    spec = merge.collect(tmp_path, expected_ranks=2).spec
    spec.start_realtime_ns = 1_700_000_000_000_000_000
    spec.ranks[1].clock_offsets = [(1000, 1000, 0.0), (4000, 4000, 0.5)]
    write_archive(spec, tmp_path / "python", writer="python")
    anchor = write_archive(spec, tmp_path / "native", writer="native")
    assert files(tmp_path / "native") == files(tmp_path / "python")
    tool = shutil.which("otf2-print")
    assert tool, "otf2-print not found: the setup installs Debian's otf2-tools (make setup)"
    proc = subprocess.run([tool, str(anchor)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "MPI_COLLECTIVE_END" in proc.stdout


def test_bad_communicator_is_an_error(tmp_path: Path) -> None:
    recs = np.zeros(1, dtype=EVENT_DTYPE)
    recs["kind"], recs["comm"] = Kind.COLL_END, 5
    spec = ArchiveSpec([("r", "function")], [("WORLD", [0])],
                       [RankSpec(0, "h", [], [LocationSpec(0, 0, "main", "main", recs)])])
    with pytest.raises(codec.native().Error, match="communicator 5"):  # type: ignore[union-attr]
        write_archive(spec, tmp_path, writer="native")


def rank_records(rng: np.random.Generator, n: int, step: int) -> np.ndarray:
    """What a (possibly killed) tracer leaves, mostly on thread 3: Enters, Leaves of any open
    or unknown region, collective ends with or without an open region."""
    recs = np.zeros(n, dtype=EVENT_DTYPE)
    recs["loc"] = rng.choice([3, 3, 3, 0, NO_LOC], n)
    recs["time"] = np.cumsum(rng.integers(0, 9, n))
    recs["kind"] = rng.choice([Kind.ENTER, Kind.LEAVE, Kind.COLL_END], n, p=[.45, .4, .15])
    recs["region"] = rng.choice([step, step + 1, step + 2, step + 3], n)
    recs["comm"] = rng.integers(0, 3, n)
    recs["root"] = rng.integers(-1, 4, n)
    recs["op"] = rng.integers(0, 12, n)
    recs["bytes_sent"] = rng.integers(0, 1 << 30, n)
    recs["bytes_recv"] = rng.integers(0, 1 << 30, n)
    recs["kind"][-3:], recs["loc"][-3:] = Kind.ENTER, 3  # still open at the end
    return recs


@pytest.mark.parametrize("seed", range(6))
def test_replay_and_lanes_match_python(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    recs = rank_records(rng, 700, step=2)
    discard = {int(i) for i in rng.integers(0, 60, 5)}
    asyncs = np.zeros(200, dtype=EVENT_DTYPE)
    asyncs["time"] = rng.integers(0, 5_000, 200)
    asyncs["aux"] = asyncs["time"] + rng.integers(-5, 300, 200)  # some end before they begin
    asyncs["kind"], asyncs["loc"] = Kind.ASYNC_COLL, NO_LOC
    asyncs["region"], asyncs["comm"] = rng.integers(0, 9, 200), rng.integers(0, 2, 200)
    asyncs["op"], asyncs["bytes_sent"] = Op.ALLREDUCE, rng.integers(0, 1 << 20, 200)

    # local regions 2..5 (region 5 undefined: dropped), local region 2 is the archive's step 2
    maps = np.array([9, 8, 2, 7, 6], dtype=np.uint32), np.array([4, 3], dtype=np.int32)
    native = merge._replay_thread(recs, 3, 2, 7, discard, 4_000, *maps), merge._lanes(asyncs, 4)
    monkeypatch.setattr(codec, "_native", None)
    python = merge._replay_thread(recs, 3, 2, 7, discard, 4_000, *maps), merge._lanes(asyncs, 4)

    (n_stream, *n_counts), (p_stream, *p_counts) = native[0], python[0]
    assert n_counts == p_counts and p_counts[0] and p_counts[1] and p_counts[2]  # steps, closed, bad
    assert n_stream.dtype == EVENT_DTYPE and n_stream.tolist() == p_stream.tolist()
    assert set(p_stream["region"].tolist()) <= {0, 2, 7, 6, 8}  # mapped; 5 dropped (0: coll begin/end)
    assert set(p_stream["comm"][p_stream["kind"] == Kind.COLL_END].tolist()) <= {4, 3, 2}
    assert len(native[1]) == len(python[1]) > 1
    for (ni, ns), (pi, ps) in zip(native[1], python[1], strict=True):
        assert ni == pi and ns.tolist() == ps.tolist()


def test_collect_same_with_and_without_the_extension(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rank in (0, 1):
        traced_rank(tmp_path, rank, start=1_000 + 7 * rank, steps=3).finalize("ok")
    killed = Tracer(2, 3, tmp_path, clock=Clock(), capacity=16, flush_interval_s=None)
    killed.enter(killed.region_id("outer"))
    killed.enter(killed.region_id("inner"))
    killed.buffer.flush()  # no finalize: open regions, a running status
    native = merge.collect(tmp_path, expected_ranks=3)
    monkeypatch.setattr(codec, "_native", None)
    python = merge.collect(tmp_path, expected_ranks=3)

    def layout(result: merge.MergeResult) -> list:
        return [result.spec.regions, result.spec.comms, [s.__dict__ for s in result.ranks]] + [
            (r.rank, r.clock_offsets, [(loc.index, loc.name, loc.kind, loc.records.tolist()) for loc in r.locations])
            for r in result.spec.ranks]

    assert layout(native) == layout(python)
    assert python.ranks[2].open_regions_closed == 3 and len(python.spec.ranks[0].locations) > 2


def test_accelerator_streams_both_writers_and_both_readers(tmp_path: Path) -> None:
    """A device stream (kind accelerator_stream, as --device-activity writes them): both writers
    write it as an OTF2 ACCELERATOR_STREAM location of the rank, byte for byte alike, and both
    readers give it back with its kernels, copies and collective (an alltoallv, as NCCL's
    SendRecv kernels are written)."""
    def rec(t: int, kind: int, **f: int) -> tuple:
        return (t, 0, f.get("sent", 0), f.get("recv", 0), f.get("region", 0), f.get("comm", -1), -1, 1, kind,
                f.get("op", 0))

    main = np.array([rec(0, Kind.ENTER, region=0), rec(100, Kind.LEAVE, region=0)], dtype=EVENT_DTYPE)
    stream = np.array([
        rec(10, Kind.ENTER, region=1), rec(20, Kind.LEAVE, region=1),
        rec(20, Kind.ENTER, region=2), rec(25, Kind.LEAVE, region=2),
        rec(30, Kind.ENTER, region=3), rec(30, Kind.COLL_BEGIN), rec(60, Kind.COLL_END, comm=0, op=Op.ALLTOALLV,
                                                                      sent=64, recv=64),
        rec(60, Kind.LEAVE, region=3)], dtype=EVENT_DTYPE)
    spec = ArchiveSpec([("dltrace.step", "function"), ("gemm", "kernel"), ("Memcpy HtoD", "data_transfer"),
                        ("ncclDevKernel_SendRecv", "coll_all2all")], [("device 0", [0])],
                       [RankSpec(0, "h", [], [LocationSpec(0, 0, "main thread", "main", main),
                                              LocationSpec(0, 1, "GPU 0 stream 7", "accelerator_stream", stream)])],
                       start_realtime_ns=1_700_000_000_000_000_000)
    write_archive(spec, tmp_path / "python", writer="python")
    anchor = write_archive(spec, tmp_path / "native", writer="native")
    assert files(tmp_path / "native") == files(tmp_path / "python")
    tool = shutil.which("otf2-print")
    assert tool
    defs = subprocess.run([tool, "-G", str(anchor)], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r'Name: "GPU 0 stream 7" <\d+>, Type: ACCELERATOR_STREAM', defs)
    tables = []
    for reader in ("python", "native"):
        con = analyze.open(tmp_path / "native", db=tmp_path / f"{reader}.duckdb", reader=reader, force=True)
        tables.append((
            con.execute("SELECT name, kind, is_main FROM locations ORDER BY thread").fetchall(),
            con.execute("SELECT r.name, r.role, r.category FROM intervals i JOIN regions r USING (region_id) "
                        "ORDER BY i.location_id, i.idx").fetchall(),
            con.execute("SELECT op, bytes, is_async FROM collectives").fetchall(),
            con.execute("SELECT phase, duration_ns FROM device_phases ORDER BY phase").fetchall()))
    assert tables[0] == tables[1]
    assert tables[0] == (
        [("main thread", "cpu_thread", True), ("GPU 0 stream 7", "accelerator_stream", False)],
        [("dltrace.step", "function", "step"), ("gemm", "kernel", "kernel"),
         ("Memcpy HtoD", "data_transfer", "memory"), ("ncclDevKernel_SendRecv", "coll_all2all", "collective")],
        [("alltoallv", 64, True)],
        # the step [0, 100): compute [10, 20), memory [20, 25), exposed [30, 60), idle the rest
        [("comm_exposed", 30), ("compute", 10), ("idle", 55), ("memory", 5)])
