"""The native reader gives exactly the portable reader's rows and tables.

Compared on the real Score-P fixtures (three OTF2 writers, timer resolutions that are not
1 GHz, mapping tables, OpenMP and CUDA locations), on archives of random records from our
writer (unbalanced Enter/Leave, collective ends without begins, messages, clock offsets), and
on an archive with an odd timer resolution and clock offsets below the global offset.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import _otf2
import duckdb
import numpy as np
import otf2
import pytest

import analyze
from analyze.readers import dispatch, otf2_native, otf2_python
from analyze.readers.columns import INTERVAL_COLUMNS, Chunk, ReadStats
from tests.analyze.snapshot import snapshot
from tests.conftest import ROOT, SCOREP_FIXTURES
from traceio.archive import ArchiveSpec, LocationSpec, RankSpec
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, Kind, Op

pytestmark = pytest.mark.skipif(not otf2_native.available(),
                                reason=f"native reader not built: {otf2_native.unavailable_reason()}")

FIXTURES = sorted(p.name for p in SCOREP_FIXTURES.iterdir() if (p / "traces.otf2").exists())
TABLES = ("intervals", "collectives", "messages", "metrics")


def rows(chunks: list[Chunk], tables: tuple[str, ...] = TABLES) -> tuple[dict[str, list[tuple]], ReadStats | None]:
    """Every table's rows, sorted, and the final stats (if ``tables`` are all of them)."""
    out: dict[str, list[tuple]] = {}
    for table in tables:
        parts = [getattr(c, table) for c in chunks]
        columns = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        out[table] = sorted(zip(*(col.tolist() for col in columns.values()), strict=True))
    if tables != TABLES:
        return out, None
    stats = [c.stats for c in chunks if c.stats is not None]
    assert len(stats) == 1
    return out, stats[0]


def both(anchor: Path, chunk_rows: int = 500_000, threads: int | None = None):  # type: ignore[no-untyped-def]
    _, python_chunks = otf2_python.read(anchor, chunk_rows)
    _, native_chunks = otf2_native.read(anchor, chunk_rows, threads)
    return rows(list(python_chunks)), rows(list(native_chunks))


@pytest.mark.parametrize("name", FIXTURES)
def test_scorep_fixtures_identical_rows(name: str) -> None:
    python, native = both(SCOREP_FIXTURES / name / "traces.otf2")
    assert native == python
    assert python[1].events > 0 and python[0]["intervals"]


@pytest.mark.parametrize("name", FIXTURES)
def test_scorep_fixtures_identical_tables(name: str, tmp_path: Path) -> None:
    tables = {}
    for reader in ("python", "native"):
        db = tmp_path / f"{reader}.duckdb"
        analyze.build(SCOREP_FIXTURES / name, db=db, reader=reader)
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("select reader from runs").fetchone() == (reader,)
        # everything but which reader it was and how the build ran
        tables[reader] = snapshot(db, runs_exclude="reader")
    assert tables["native"] == tables["python"]
    assert tables["python"]["intervals"]


def random_spec(seed: int, ranks: int = 3, events: int = 400) -> ArchiveSpec:
    """Random record streams: Enters and Leaves of random regions (unbalanced on purpose),
    collective begins and ends in any order, sends and receives; ranks after the first carry
    clock offsets that bend their time (also below the trace start)."""
    rng = np.random.default_rng(seed)
    n_regions = 6
    specs = []
    for rank in range(ranks):
        locations = []
        for index in range(1 + rank % 2):
            recs = np.zeros(events, dtype=EVENT_DTYPE)
            recs["time"] = 10_000 + np.cumsum(rng.integers(0, 50, events))  # ties included
            recs["kind"] = rng.choice([Kind.ENTER, Kind.LEAVE, Kind.COLL_BEGIN, Kind.COLL_END,
                                       Kind.SEND, Kind.RECV], events, p=[.4, .35, .07, .08, .05, .05])
            recs["region"] = rng.integers(0, n_regions, events)
            recs["comm"] = rng.integers(0, 2, events)
            recs["root"] = rng.integers(-1, ranks, events)
            recs["op"] = rng.choice([int(o) for o in Op if 0 < o < 10], events)
            recs["bytes_sent"] = rng.integers(0, 1 << 40, events)
            recs["bytes_recv"] = rng.integers(0, 1 << 40, events)
            recs["aux"] = rng.integers(0, 100, events)  # message tags
            recs["loc"] = index
            locations.append(LocationSpec(rank, index, f"thread {index}", "main" if index == 0 else "thread",
                                          recs))
        offsets = [] if rank == 0 else [(10_000, -3_000 * rank, 5.0), (20_000, 700 * rank, 5.0)]
        specs.append(RankSpec(rank, f"host{rank % 2}", offsets, locations))
    regions = [(f"region {i}", "coll_all2all" if i == 3 else "function") for i in range(n_regions)]
    return ArchiveSpec(regions, [("WORLD", list(range(ranks))), ("pair", [1, 0])], specs,
                       start_realtime_ns=1_700_000_000_123_456_789)


@pytest.mark.parametrize("seed", range(4))
def test_random_archives_identical(seed: int, tmp_path: Path) -> None:
    anchor = write_archive(random_spec(seed), tmp_path)
    python, native = both(anchor)
    assert native == python
    stats = python[1]
    # the streams really are unbalanced: every kind of repair happened
    assert stats.unmatched_leaves and stats.truncated and stats.unmatched_collective_ends
    assert python[0]["collectives"] and python[0]["messages"]


@pytest.mark.parametrize("name", [*FIXTURES, "random"])
def test_decode_only_counts_every_event_and_makes_no_rows(name: str, tmp_path: Path) -> None:
    """bench/scale.py times the OTF2 library alone with ``decode_only``: it must decode the
    same events (every record type, metrics and unknown ones included) and do nothing else."""
    anchor = write_archive(random_spec(3), tmp_path) if name == "random" else SCOREP_FIXTURES / name / "traces.otf2"
    defs, chunks = otf2_native.read(anchor, decode_only=True)
    counted = list(chunks)
    assert all(len(col) == 0 for chunk in counted for table in TABLES for col in getattr(chunk, table).values())
    _, full = rows(list(otf2_native.read(anchor)[1]))
    assert sum(c.events for c in counted) == full.events == sum(loc.events for loc in defs.locations) > 0


def test_small_chunks_and_more_threads_than_locations(tmp_path: Path) -> None:
    anchor = write_archive(random_spec(7, ranks=2, events=300), tmp_path)
    python, native = both(anchor, chunk_rows=7, threads=8)
    assert native == python
    _, chunks = otf2_native.read(anchor, 7, threads=2)
    sizes = [sum(len(next(iter(getattr(c, t).values()))) for t in TABLES) for c in chunks]
    assert len(sizes) > 10 and sum(sizes) == sum(len(v) for v in python[0].values())


@pytest.mark.parametrize("chunk_rows", [3, 64, 500_000])
def test_rows_the_same_whether_or_not_locations_declare_their_events(chunk_rows: int, tmp_path: Path) -> None:
    """The reader gives each chunk's intervals their room at once: from the events the
    locations still declare, or (declaring none) a fixed amount grown beyond by doubling. Both
    give the rows the portable reader gives, in chunks of at most ``chunk_rows`` plus one batch."""
    from traceio import _otf2native

    anchor = write_archive(random_spec(3, ranks=2, events=2000), tmp_path)
    defs = otf2_native.definitions(anchor)
    locs = [loc for loc in defs.locations if loc.events]
    read = {}
    for declared in ([loc.events for loc in locs], None):
        reader = _otf2native.Reader(str(anchor), [loc.location_id for loc in locs], [loc.rank for loc in locs],
                                    defs.global_offset, defs.resolution, declared)
        chunks, finished = [], False
        while not finished:
            intervals, *_, finished = reader.read(chunk_rows)
            chunks.append(otf2_native._table(intervals, INTERVAL_COLUMNS))
        reader.close()
        assert max(len(c["idx"]) for c in chunks) <= chunk_rows + 65536 + 64  # a batch, what is open
        read[declared is None], _ = rows([Chunk(c, {}, {}, 0) for c in chunks], tables=("intervals",))
    python, _ = both(anchor)
    assert read[False] == read[True] == {"intervals": python[0]["intervals"]}


def test_clock_offsets_interpolated_like_the_library(tmp_path: Path) -> None:
    """Rank 1 is 1000 ns behind at local 1000 and 4000 ns behind at 4000: local 2500 is 5000."""
    def rec(t: int, kind: int) -> tuple:
        return (t, 0, 0, 0, 0, -1, -1, 0, kind, 0)

    spec = ArchiveSpec([("r", "function")], [], [
        RankSpec(0, "h", [], [LocationSpec(0, 0, "main", "main", np.array(
            [rec(1000, Kind.ENTER), rec(6000, Kind.LEAVE)], dtype=EVENT_DTYPE))]),
        RankSpec(1, "h", [(1000, 1000, 0.0), (4000, 4000, 0.0)], [LocationSpec(1, 0, "main", "main", np.array(
            [rec(2500, Kind.ENTER), rec(2501, Kind.LEAVE)], dtype=EVENT_DTYPE))]),
    ])
    anchor = write_archive(spec, tmp_path)
    python, native = both(anchor)
    assert native == python
    # trace start is 1000 (rank 0's enter): rank 1's instance is [5000, 5002] - 1000
    assert [r[6:8] for r in native[0]["intervals"]] == [(0, 5000), (4000, 4002)]


def test_odd_timer_resolution_and_times_before_the_offset(tmp_path: Path) -> None:
    """Ticks of a 2.6 GHz clock (floor division in ticks_to_ns), and a negative clock offset
    that puts corrected times before the archive's global offset (negative ns)."""
    with otf2.writer.open(str(tmp_path), timer_resolution=2_600_000_001) as trace:
        region = trace.definitions.region("work")
        loc0 = trace.definitions.location("main", group=trace.definitions.location_group(
            "rank 0", system_tree_parent=trace.definitions.system_tree_node("node")))
        loc1 = trace.definitions.location("main", group=trace.definitions.location_group(
            "rank 1", system_tree_parent=trace.definitions.system_tree_node("node")))
        for loc, shift in ((loc0, 0), (loc1, 3)):
            writer = trace.event_writer_from_location(loc)
            for k in range(50):
                t = 5_000_000_000 + shift + k * 1_234_567_891
                writer.enter(t, region)
                writer.leave(t + 777_777_777 + k, region)
        dw = _otf2.Archive_GetDefWriter(trace._handle, loc1._ref)
        _otf2.DefWriter_WriteClockOffset(dw, 5_000_000_000, -2_000_000_017, 1.0)
        _otf2.DefWriter_WriteClockOffset(dw, 70_000_000_000, 1_000_000_003, 1.0)
    python, native = both(tmp_path / "traces.otf2")
    assert native == python
    starts = [r[6] for r in native[0]["intervals"]]
    assert min(starts) < 0 < max(starts)


def test_truncated_events_raise_reader_error(tmp_path: Path) -> None:
    anchor = write_archive(random_spec(1, ranks=1), tmp_path)
    evt = sorted((tmp_path / "traces").glob("*.evt"))[0]
    evt.write_bytes(evt.read_bytes()[:50])
    with pytest.raises(dispatch.ReaderError, match="cannot read the events of"):
        _, chunks = otf2_native.read(anchor)
        list(chunks)


def test_seam_prefers_native(tmp_path: Path) -> None:
    anchor = write_archive(random_spec(2, ranks=1), tmp_path)
    assert dispatch.read(anchor)[0] == "native"
    assert dispatch.read(anchor, prefer="python")[0] == "python"
    assert dispatch.fallback_notice() is None


def test_fallback_without_the_extension(tmp_path: Path) -> None:
    """With the extension absent, analyze says so in one line and builds the same tables."""
    run = tmp_path / "run"
    write_archive(random_spec(3, ranks=2, events=200), run)
    native_db = tmp_path / "native.duckdb"
    analyze.build(run, db=native_db)
    script = ("import sys; sys.modules['traceio._otf2native'] = None\n"
              "from analyze import cli\n"
              f"sys.exit(cli.main(['phases', {str(run)!r}, '--db', {str(tmp_path / 'python.duckdb')!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "native OTF2 reader is not built" in lines[0] and "Python reader" in lines[0]
    with duckdb.connect(str(tmp_path / "python.duckdb"), read_only=True) as py, \
            duckdb.connect(str(native_db), read_only=True) as nat:
        assert py.execute("select reader from runs").fetchone() == ("python",)
        assert nat.execute("select reader from runs").fetchone() == ("native",)
        for table in ("intervals", "collectives", "p2p", "steps", "phases"):
            sql = f"select * from {table} order by all"
            assert py.execute(sql).fetchall() == nat.execute(sql).fetchall(), table


@pytest.mark.parametrize("reader", ["python", "native"])
def test_exclusive_time_when_children_and_parents_are_chunks_apart(reader: str, tmp_path: Path) -> None:
    """exclusive_ns is computed while loading, chunk by chunk: it must equal the definition
    (duration minus the direct children's durations) however the rows are split."""
    anchor = write_archive(random_spec(5, ranks=2, events=600), tmp_path / "run")
    db = tmp_path / "x.duckdb"
    analyze.build(anchor, db=db, reader=reader, chunk_rows=3)
    with duckdb.connect(str(db), read_only=True) as con:
        wrong, with_children = con.execute("""
            select count(*) filter (where i.exclusive_ns <> i.duration_ns - coalesce(c.ns, 0)),
                   count(c.ns)
            from intervals i left join (select location_id, parent_idx, sum(duration_ns) as ns
                                        from intervals where parent_idx is not null group by all) c
              on c.location_id = i.location_id and c.parent_idx = i.idx""").fetchone()
    assert wrong == 0 and with_children > 50


def test_progress_is_drawn_on_a_terminal_only(tmp_path: Path) -> None:
    """Reading for more than half a second redraws one progress line on a terminal's stderr
    (here a pseudo-terminal), and erases it when done; through a pipe nothing is written for
    a stage shorter than LOG_EVERY (test_fallback_without_the_extension sees only the notice;
    test_progress.py has the log's lines)."""
    import pty

    write_archive(random_spec(4, ranks=2, events=80_000), tmp_path / "run")  # ~1-3 s to read
    script = (f"from analyze.tables import database; database.build({str(tmp_path / 'run')!r}, "
              f"db={str(tmp_path / 'x.duckdb')!r}, reader='python')")
    master, slave = pty.openpty()
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, stderr=slave, stdout=subprocess.PIPE,
                          timeout=300)
    os.close(slave)
    drawn = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        drawn += data
    os.close(master)
    assert proc.returncode == 0
    assert b"reading traces.otf2: 100% (0.2M of 0.2M events, " in drawn and drawn.endswith(b"\r\x1b[K")
