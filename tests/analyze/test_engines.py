"""The local and the Dask engine build identical tables: on every real Score-P fixture (metric
and device ones included) and Kineto fixture, on generated archives (the benchmark's DDP-like
steps on 2 and 8 ranks, random unbalanced record streams, a literal trace with every kind of
matching, one with communication recognized by name only) and with either reader.

Both run the same task functions; what differs is the process a task runs in (threads here,
worker processes of a local Dask cluster there), how its arguments and results travel
(pickled) and which tasks run side by side. The Dask cluster (2 single-threaded workers) is
started once for the module.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

import analyze
from analyze.engine.local import LocalEngine
from analyze.schema import COLLECTIVES, REGIONS
from analyze.tables import database, pattern_set, stages
from tests.analyze.snapshot import snapshot
from tests.analyze.test_native_reader import random_spec
from tests.conftest import ROOT
from tests.literal import write_literal
from traceio import codec
from traceio.otf2_writer import write_archive

FIXTURES = sorted(p.parent.relative_to(ROOT / "tests" / "fixtures")
                  for p in (ROOT / "tests" / "fixtures").glob("scorep*/*/traces.otf2"))
KINETO = sorted(p.relative_to(ROOT / "tests" / "fixtures") for p in (ROOT / "tests" / "fixtures" / "kineto").iterdir()
                if p.is_dir())
MS = 1_000_000
RANKS_MATCHED = COLLECTIVES.names.index("ranks_matched")


@pytest.fixture(scope="module")
def dask_engine() -> Iterator[object]:
    from analyze.engine.on_dask import DaskEngine

    engine = DaskEngine.connect(None, workers=2)
    yield engine
    engine.close()


def same_tables(run: Path, tmp_path: Path, dask_engine: object, **options: object) -> dict[str, list]:
    """Build ``run`` with both engines (the local one with 2 threads, as the cluster has 2
    workers, so both split the work alike) and check that every table is identical."""
    local = analyze.build(run, db=tmp_path / "local.duckdb", engine=LocalEngine(2), **options).db
    dask = analyze.build(run, db=tmp_path / "dask.duckdb", engine=dask_engine, **options).db
    ours, theirs = snapshot(local), snapshot(dask)
    assert theirs == ours
    return ours


def literal_run(path: Path) -> Path:
    """Two ranks, two steps: blocking and asynchronous allreduces, a broadcast with a late
    root, a late sender, a nested user region."""
    coll = {"op": "allreduce", "bytes": 4096}
    items = []
    for step in range(2):
        t = step * 300 * MS
        items += [
            (0, "dltrace.step", t, t + 200 * MS), (0, "MPI_Allreduce", t + 100 * MS, t + 160 * MS, coll),
            (1, "dltrace.step", t, t + 210 * MS), (1, "MPI_Allreduce", t + 150 * MS, t + 160 * MS, coll),
            (0, "MPI_Bcast", t + 165 * MS, t + 170 * MS, {"op": "bcast", "bytes": 64, "root": 1}),
            (1, "MPI_Bcast", t + 168 * MS, t + 170 * MS, {"op": "bcast", "bytes": 64, "root": 1}),
            (0, "MPI_Send", t + 20 * MS, t + 30 * MS, {"send": 1, "tag": 7, "bytes": 64}),
            (1, "MPI_Recv", t + 10 * MS, t + 32 * MS, {"recv": 0, "tag": 7, "bytes": 64}),
            (0, "outer", t + 40 * MS, t + 80 * MS), (0, "inner", t + 50 * MS, t + 60 * MS),
            (1, "torch.distributed.all_reduce", t + 40 * MS, t + 90 * MS,
             {"op": "allreduce", "bytes": 100, "lane": True}),
            (0, "torch.distributed.all_reduce", t + 45 * MS, t + 90 * MS,
             {"op": "allreduce", "bytes": 100, "lane": True}),
        ]
    write_literal(path, items)
    return path


def test_literal_trace(tmp_path: Path, dask_engine: object) -> None:
    tables = same_tables(literal_run(tmp_path / "run"), tmp_path, dask_engine)
    # 2 ranks x 2 steps x (allreduce, bcast, lane allreduce); 2 sends and 2 receives
    assert len(tables["collectives"]) == 12 and len(tables["p2p"]) == 4
    assert len(tables["phases"]) == 2 * 2 * 5


def named_run(path: Path) -> Path:
    """Four ranks, two steps, communication recognized by name beside a recorded allreduce:
    LBANN's allreduce enclosing Aluminum's, a GPI-2 barrier, Gloo on a worker thread, a
    non-blocking LBANN allreduce and the wait that completes it, and mylib's allreduce (a
    pattern of the user's own file)."""
    lbann = "void lbann::lbann_comm::allreduce<float>(float*, int, El::mpi::Comm const&, El::mpi::Op)"
    al = ("void Al::Allreduce<Al::MPIBackend, float>(float const*, float*, unsigned long, Al::ReductionOperator, "
          "Al::MPIBackend::comm_type&, Al::MPIBackend::allreduce_algo_type)")
    items = []
    for rank in range(4):
        late = 2 * rank
        for step in range(2):
            t = step * 100
            items += [
                (rank, "dltrace.step", t * MS, (t + 100) * MS),
                (rank, "lbann::model::backward_prop()", (t + 5) * MS, (t + 40) * MS),
                (rank, "void lbann::lbann_comm::nb_allreduce<float>(float*, int, El::mpi::Comm const&, "
                 "Al::request&, El::mpi::Op)", (t + 10) * MS, (t + 11) * MS),
                (rank, "lbann::lbann_comm::wait(Al::request&)", (t + 40) * MS, (t + 45) * MS),
                (rank, lbann, (t + 50 + late) * MS, (t + 60) * MS), (rank, al, (t + 51 + late) * MS, (t + 59) * MS),
                (rank, "gaspi_barrier", (t + 62) * MS, (t + 66 + late) * MS),
                (rank, "MPI_Allreduce", (t + 70 + late) * MS, (t + 78) * MS, {"op": "allreduce", "bytes": 64}),
                (rank, "mylib::sum_gradients(float*)", (t + 80 + late) * MS, (t + 88) * MS),
                (rank, "gloo::allreduce(gloo::AllreduceOptions const&)", (t + 20 + late) * MS, (t + 30) * MS,
                 {"lane": True}),
            ]
    write_literal(path, items)
    return path


def test_name_only_collectives(tmp_path: Path, dask_engine: object, monkeypatch: pytest.MonkeyPatch) -> None:
    # tasks of a few events: two read buckets, a group and a shuffle bucket per rank, so the
    # inferred groups and the waits' operations are joined from several tasks' reports
    monkeypatch.setattr(stages, "READ_TASK_EVENTS", (1, stages.READ_TASK_EVENTS[1]))
    monkeypatch.setattr(stages, "GROUP_EVENTS", 1)
    mine = tmp_path / "mylib.toml"
    mine.write_text('[[pattern]]\nlibrary = "mylib"\nglob = "mylib::sum_gradients"\ncategory = "allreduce"\n')
    tables = same_tables(named_run(tmp_path / "run"), tmp_path, dask_engine, patterns=mine)
    source = COLLECTIVES.names.index("source")
    # per rank and step: one recorded allreduce; LBANN's (Aluminum's inside is part of it),
    # the GPI-2 barrier, Gloo's and mylib's by name; the non-blocking start is not matched
    by_source = [row[source] for row in tables["collectives"]]
    assert by_source.count("record") == 4 * 2 and by_source.count("name") == 4 * 2 * 4
    assert {row[RANKS_MATCHED] for row in tables["collectives"]} == {4}
    assert sorted(row[0] for row in tables["communicators"] if row[0] < 0) == [-4, -3, -2, -1]
    name, op = REGIONS.names.index("match_name"), REGIONS.names.index("pattern_op")
    assert ("lbann::lbann_comm::wait", "allreduce") in {(row[name], row[op]) for row in tables["regions"]}


def test_without_the_codec_the_tables_are_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the codec writes and reads the build's Parquet files back (numbers and, for the final
    # tables, text); without it DuckDB does both, and every table is the same
    run = named_run(tmp_path / "run")
    mine = tmp_path / "mylib.toml"
    mine.write_text('[[pattern]]\nlibrary = "mylib"\nglob = "mylib::sum_gradients"\ncategory = "allreduce"\n')
    native = snapshot(analyze.build(run, db=tmp_path / "native.duckdb", engine=LocalEngine(2), patterns=mine,
                                    reader="python").db)
    monkeypatch.setattr(codec, "_native", None)
    without = snapshot(analyze.build(run, db=tmp_path / "without.duckdb", engine=LocalEngine(2), patterns=mine,
                                     reader="python").db)
    assert without == native
    assert len(native["collectives"]) == 40


@pytest.mark.parametrize(("named", "limit", "in_sql", "expected"), [
    (True, 5, True, [(0, 0, 10), (1, 1, 10), (2, 2, 10), (3, 3, 10)]),  # a rank over the limit: alone, numbered in SQL
    (True, 20, True, [(0, 1, 20), (2, 3, 20)]),  # two ranks at a time, in numpy
    # only recorded collectives (the bench's synthetic archive): counted in numpy from the
    # codec's files when they are at most the limit, else in SQL
    (False, 100, True, [(0, 0, 135), (1, 1, 135), (2, 2, 135), (3, 3, 135)]),
    (False, 300, True, [(0, 1, 270), (2, 3, 270)]),
    (False, 540, False, [(0, 3, 540)]),
])
def test_collectives_numbered_a_few_ranks_at_a_time_give_the_same_tables(
        named: bool, limit: int, in_sql: bool, expected: list[tuple[int, int, int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one group of 4 ranks: named_run's 10 collectives each (recorded and by name), or 135 recorded
    if named:
        run = named_run(tmp_path / "run")
    else:
        from bench import synth

        run, _ = synth.write(12_000, tmp_path / "run", ranks=4)
    mine = tmp_path / "mylib.toml"
    mine.write_text('[[pattern]]\nlibrary = "mylib"\nglob = "mylib::sum_gradients"\ncategory = "allreduce"\n')
    patterns = mine if named else None
    whole = snapshot(analyze.build(run, db=tmp_path / "whole.duckdb", engine=LocalEngine(1), patterns=patterns).db)
    batches: list[tuple[str, list[tuple[int, int, int]]]] = []
    batched, counted = stages._batches, stages._rank_batches
    monkeypatch.setattr(stages, "COLLECTIVE_ROWS", limit)
    monkeypatch.setattr(stages, "FINISH_VECTORS", 1)  # SQL's rows are finished a slice at a time
    monkeypatch.setattr(stages, "_batches", lambda counts, limit: batches.append(("", batched(counts, limit)))
                        or batches[-1][1])
    monkeypatch.setattr(stages, "_rank_batches", lambda con, limit: batches.append(("sql", [])) or counted(con, limit))
    apart = snapshot(analyze.build(run, db=tmp_path / "apart.duckdb", engine=LocalEngine(1), patterns=patterns).db)
    assert batches == ([("sql", [])] if in_sql else []) + [("", expected)]
    assert apart == whole


@pytest.mark.slow
@pytest.mark.parametrize("fixture", FIXTURES, ids=str)
def test_scorep_fixtures(fixture: Path, tmp_path: Path, dask_engine: object) -> None:
    tables = same_tables(ROOT / "tests" / "fixtures" / fixture, tmp_path, dask_engine)
    assert tables["intervals"] and tables["phases"]


@pytest.mark.slow
@pytest.mark.parametrize("fixture", KINETO, ids=str)
def test_kineto_fixtures(fixture: Path, tmp_path: Path, dask_engine: object) -> None:
    # one read task (a Chrome trace is read whole), then groups of ranks as for OTF2
    tables = same_tables(ROOT / "tests" / "fixtures" / fixture, tmp_path, dask_engine)
    assert tables["intervals"] and tables["chrome_events"] and tables["chrome_files"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 8])
def test_synthetic_ddp_steps(ranks: int, tmp_path: Path, dask_engine: object) -> None:
    from bench import synth

    run, events = synth.write(40_000, tmp_path / "run", ranks=ranks)
    tables = same_tables(run.parent, tmp_path, dask_engine)
    # with 8 ranks the work is split into several groups and shuffle buckets
    steps_per_rank = -(-40_000 // (ranks * synth.events_per_step()))
    assert len(tables["steps"]) == ranks * steps_per_rank
    # every allreduce found all ranks
    assert {row[RANKS_MATCHED] for row in tables["collectives"]} == {ranks}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 3])
def test_random_record_streams(seed: int, tmp_path: Path, dask_engine: object) -> None:
    # 3 ranks: random_spec's clock offsets put a fourth rank's times before 0, a global offset
    # the runs table cannot hold (it wraps around as an unsigned tick)
    write_archive(random_spec(seed, ranks=3, events=3000), tmp_path / "run")
    tables = same_tables(tmp_path / "run", tmp_path, dask_engine)
    assert tables["collectives"] and tables["p2p"]


@pytest.mark.slow
def test_python_reader_and_step_region(tmp_path: Path, dask_engine: object) -> None:
    run = literal_run(tmp_path / "run")
    tables = same_tables(run, tmp_path, dask_engine, reader="python", step_region="outer")
    assert {row[-1] for row in tables["steps"]} == {"region:outer"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marker_steps_numbered_in_numpy_as_the_query_numbers_them(seed: int, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # several ranks in a group, in several files, unsorted, with steps starting at the same
    # time (then by position): the numpy numbering equals steps.candidate("marker")'s
    import duckdb
    import numpy as np

    from analyze.tables import steps

    rng = np.random.default_rng(seed)
    spec = stages.Spec(anchor="", root=str(tmp_path), reader="native", global_offset=0, resolution=1, buckets=1)
    con = duckdb.connect()
    for k in range(3):
        n = int(rng.integers(1, 400))
        start = rng.integers(0, 50, n) * 1000  # ties
        rows = {"location_id": rng.integers(0, 3, n), "rank": rng.integers(0, 5, n).astype(np.int32),
                "idx": rng.permutation(n) + 1000 * k, "region_id": np.full(n, 7), "start_ns": start,
                "end_ns": start + rng.integers(0, 900, n), "rank_group": np.zeros(n, np.int32)}
        spec.work.write_arrays(con, stages.STEP_INTERVALS, rows, f"b{k}c0")
    numbered = stages._marker_steps(spec, 0)
    assert numbered is not None
    got = sorted(zip(*(np.asarray(numbered[c]).tolist() for c in ("rank", "step", "start_ns", "end_ns",
                                                                     "duration_ns")), strict=True))
    spec.work.view(con, stages.STEP_INTERVALS, [0], name="intervals")
    con.execute("CREATE VIEW regions AS SELECT 7::BIGINT AS region_id, 'step' AS category")
    con.execute("CREATE VIEW locations AS SELECT unnest([0, 1, 2])::BIGINT AS location_id, true AS is_main")
    want = sorted(con.execute(f"SELECT rank, step, start_ns, end_ns, duration_ns FROM ({steps.candidate('marker')})"
                              ).fetchall())
    assert got == want and len(want) > 3
    assert stages._marker_steps(spec, 1) is None  # no markers: the query writes the empty file
    monkeypatch.setattr(stages, "COLLECTIVE_ROWS", len(want) - 1)
    assert stages._marker_steps(spec, 0) is None  # more than memory should hold: the query, which spills


@pytest.mark.parametrize("ids", [(), (0,), (3, 7, 9), (1 << 40, 5), (-2, 4)])
def test_read_tasks_pick_rows_by_id_as_isin_does(ids: tuple[int, ...]) -> None:
    import numpy as np

    values = np.array([-3, -2, -1, 0, 1, 3, 4, 5, 7, 8, 9, 10, 1 << 22, 1 << 40, (1 << 40) + 1], dtype=np.int64)
    for given in (values, values[values >= 0], values[:0]):  # (ids never negative: another path)
        assert stages._Members(ids).of(given).tolist() == np.isin(given, np.array(ids, dtype=np.int64)).tolist()


def test_duckdb_threads_follow_the_tasks_that_run_at_once(tmp_path: Path, dask_engine: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks side by side share the cores: as many tasks as workers get a DuckDB thread each
    (on this 2-core machine), a lone task every core; the stages' instance is set per stage,
    and a build with each split gives the same tables (same_tables, above)."""
    monkeypatch.setattr("analyze.engine.base.cores", lambda: 8)
    engine = LocalEngine(4)
    assert [engine.threads_per_task(n) for n in (0, 1, 2, 3, 4, 100)] == [8, 8, 4, 2, 2, 2]
    assert dask_engine.threads_per_task(1) == 8 and dask_engine.threads_per_task(5) == 4  # type: ignore[attr-defined]

    root = str(tmp_path / "tables")
    spec = stages.Spec(anchor="", root=root, reader="native", global_offset=0, resolution=1, buckets=1)
    default = _duckdb_default_threads()
    try:
        for threads, expected in ((3, 3), (1, 1), (None, default), (2, 2)):  # None: DuckDB's default
            con = stages._connect(dataclasses.replace(spec, threads=threads))
            assert con.execute("SELECT current_setting('threads')").fetchone() == (expected,)
    finally:
        stages.release(root)


def _duckdb_default_threads() -> int:
    with duckdb.connect() as con:
        found = con.execute("SELECT current_setting('threads')").fetchone()
    assert found is not None
    return int(found[0])


# in a process of its own: the threads of this one (Dask's, earlier tests' background ones)
# come and go
_COUNT_THREADS = """
import os, sys
from analyze.tables import stages
spec = stages.Spec(anchor="", root=sys.argv[1], reader="native", global_offset=0, resolution=1, buckets=1,
                   threads=1)
before = len(os.listdir("/proc/self/task"))
con = stages._connect(spec)
threads, io_threads = con.execute("SELECT current_setting('threads'), current_setting('async_threads')").fetchone()
con.execute("SELECT sum(i) FROM range(1000000) t(i)").fetchone()
print(threads, io_threads, len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc (Linux)")
def test_a_builds_duckdb_has_no_background_thread_to_trim_the_heap(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB's background threads (workers, asynchronous I/O) call malloc_trim when idle,
    handing back the heap the analyze command keeps (stages.ONE_THREAD): a build's instance
    (the stages', with the driver's database attached to it) starts none, and runs its queries
    on the calling thread; the cause tables' queries get every core back."""
    counted = subprocess.run([sys.executable, "-c", _COUNT_THREADS, str(tmp_path / "tables")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120, check=True)
    assert counted.stdout.split() == ["1", "0", "0"], counted.stdout + counted.stderr  # no thread made

    made: list[tuple[object, ...]] = []
    real_connect = duckdb.connect

    def spy(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        con = real_connect(*args, **kwargs)  # type: ignore[arg-type]
        if not kwargs.get("read_only"):
            made.append(con.execute("SELECT current_setting('threads'), current_setting('async_threads')").fetchone())
        return con

    causes_threads: list[int] = []
    real_causes = database.build_causes

    def causes(con: duckdb.DuckDBPyConnection) -> None:
        causes_threads.append(con.execute("SELECT current_setting('threads')").fetchone()[0])  # type: ignore[index]
        real_causes(con)

    monkeypatch.setattr(duckdb, "connect", spy)
    monkeypatch.setattr(database, "build_causes", causes)
    analyze.build(literal_run(tmp_path / "run"), engine=LocalEngine(2), causes=True)
    assert made and all(settings == (1, 0) for settings in made), made
    assert causes_threads == [_duckdb_default_threads()]


def test_a_local_build_makes_one_duckdb_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's database is attached to the instance the stages' tasks use (a second
    instance cost 20-40 ms to make, and a malloc_trim to close); the database file it leaves
    is complete (checkpointed: no WAL), names no attached database, and nothing of the
    instance (it is closed, its spill directory gone) outlives the build."""
    made: list[str] = []
    real_connect = duckdb.connect

    def spy(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        if not kwargs.get("read_only"):
            made.append(str(args[0]) if args else ":memory:")
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(duckdb, "connect", spy)
    paths = analyze.build(literal_run(tmp_path / "run"), engine=LocalEngine(2), causes=True)
    monkeypatch.undo()
    assert made == [":memory:"]
    assert not stages._instances and not stages._attached
    assert not Path(str(paths.db) + ".wal").exists()
    assert not list(paths.tables.resolve().glob(".spill-*"))
    with duckdb.connect(str(paths.db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM intervals").fetchone()[0] > 0  # type: ignore[index]
        assert con.execute("SELECT count(*) FROM overlap").fetchone()[0] > 0  # type: ignore[index]
        views = con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall()
        assert views and not any(stages.TARGET + "." in sql for (sql,) in views)


def test_built_reads_on_the_builds_own_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``database.built`` (what ``analyze phases`` prints from) reads a database it builds on
    the build's connection, with no second DuckDB instance, and what it reads there is what a
    read-only connection to the installed database reads; a current database is read on a
    read-only connection."""
    from analyze.cli import phases as phases_cli

    run = literal_run(tmp_path / "run")
    made: list[bool] = []
    real_connect = duckdb.connect

    def spy(*args: object, **kwargs: object) -> duckdb.DuckDBPyConnection:
        made.append(bool(kwargs.get("read_only")))
        return real_connect(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(duckdb, "connect", spy)
    paths, (table, source, *_) = database.built(run, phases_cli.read, engine=LocalEngine(2))
    assert made == [False]  # the build's one instance, read too
    made.clear()
    again, (table_again, source_again, *_) = database.built(run, phases_cli.read, engine=LocalEngine(2))
    assert again == paths and made.count(True) >= 1 and False not in made  # current: read-only
    monkeypatch.undo()
    assert source == source_again == ("marker",)
    assert table.equals(table_again) and list(table["rank"]) == [0, 1]


def test_a_failing_read_of_a_build_still_installs_it(tmp_path: Path) -> None:
    """What the reader given to ``database.built`` raises reaches the caller, and the tables it
    was reading from are installed all the same (nothing built is lost)."""
    run = literal_run(tmp_path / "run")

    def read(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("SELECT count(*) FROM phases").fetchone()
        raise ValueError("a summary failed")

    with pytest.raises(ValueError, match="a summary failed"):
        database.built(run, read, engine=LocalEngine(2))
    assert not stages._instances and not stages._attached
    paths = database.resolve(run)
    assert database.is_current(paths, {"step_region": None, "patterns": pattern_set.load(None).digest()})
    with duckdb.connect(str(paths.db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM phases").fetchone()[0] > 0  # type: ignore[index]


def test_a_failed_build_closes_its_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that fails after the driver attached its database leaves no instance open, no
    temporary database, and the next build of the run works."""
    run = literal_run(tmp_path / "run")

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a stage failed")

    monkeypatch.setattr(stages, "match", fails)
    with pytest.raises(RuntimeError, match="a stage failed"):
        analyze.build(run, engine=LocalEngine(2))
    monkeypatch.undo()
    assert not stages._instances and not stages._attached
    paths = database.resolve(run)
    assert not list(paths.db.parent.glob(f".{paths.db.name}.tmp-*"))
    built = analyze.build(run, engine=LocalEngine(2))
    with duckdb.connect(str(built.db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM phases").fetchone()[0] > 0  # type: ignore[index]


def test_an_engine_of_ones_own_without_threads_per_task_still_builds(tmp_path: Path) -> None:
    class Mine:  # the Engine protocol as a user may have written it before threads_per_task
        name = "mine"

        def __init__(self) -> None:
            self.inner = LocalEngine(2)
            self.workers, self.stages = 2, self.inner.stages

        def run(self, *args: object, **kwargs: object) -> list[object]:
            return self.inner.run(*args, **kwargs)  # type: ignore[arg-type]

        def everywhere(self, fn, *args):  # type: ignore[no-untyped-def]
            fn(*args)

        def close(self) -> None:
            pass

    run = literal_run(tmp_path / "run")
    mine = snapshot(analyze.build(run, db=tmp_path / "mine.duckdb", engine=Mine()).db)  # type: ignore[arg-type]
    assert mine == snapshot(analyze.build(run, db=tmp_path / "local.duckdb", engine=LocalEngine(2)).db)
