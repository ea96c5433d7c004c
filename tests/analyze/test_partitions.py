"""A run's tables on disk: Parquet datasets partitioned by rank, the database's views over them,
the SQL in the docs, read-only runs, and how builds replace each other."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import duckdb
import pytest

import analyze
from analyze.errors import AnalyzeError
from analyze.schema import CAUSE_TABLES, TABLES
from analyze.tables import database
from tests.analyze.test_engines import literal_run
from tests.conftest import ROOT

PARQUET_TABLES = [t for t in TABLES if t not in CAUSE_TABLES]

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_IN_DOCS = "traces/run-0001"  # the run the docs' examples name


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return literal_run(tmp_path / "run")


def builds(run: Path) -> list[str]:
    return sorted(p.name for p in (run / ".tables").iterdir() if p.is_dir())


def test_tables_are_parquet_datasets_partitioned_by_rank(run: Path) -> None:
    db = analyze.open(run)
    link = run / "tables"
    assert link.is_symlink() and os.readlink(link) == f".tables/{builds(run)[0]}"
    filled = set()
    for table in PARQUET_TABLES:
        if table.partition_by:
            # a table without rows has one empty file, in the folder of rank 0
            assert sorted(p.name for p in (link / table.name).iterdir()) in (["rank=0", "rank=1"], ["rank=0"])
            files = sorted((link / table.name).glob("rank=*/*.parquet"))
            pattern, hive = f"{link}/{table.name}/*/*.parquet", "true"
        else:
            files = sorted((link / table.name).glob("*.parquet"))
            pattern, hive = f"{link}/{table.name}/*.parquet", "false"
        assert files, table.name
        # hive style: the partition column is in the directory names only
        stored = [r[0] for r in db.execute(f"describe select * from read_parquet('{files[0]}', hive_partitioning = false)").fetchall()]
        assert stored == [c for c in table.names if c != table.partition_by]
        # read as one dataset without our views, the files give the view's rows (as text:
        # Python needs pytz for TIMESTAMPTZ values)
        cols = ", ".join(f"{c}::VARCHAR" for c in table.names)
        direct = db.execute(f"select {cols} from read_parquet('{pattern}', hive_partitioning = {hive}) "
                            "order by all").fetchall()
        via_view = db.execute(f"select {cols} from {table.name} order by all").fetchall()
        assert direct == via_view, table.name
        if via_view:
            filled.add(table.name)
            if table.partition_by:
                assert sorted(p.name for p in (link / table.name).iterdir()) == ["rank=0", "rank=1"]
    # the literal run has every table of the phase model (no metrics, devices or Chrome JSON)
    assert {t.name for t in TABLES[:9]} <= filled
    views = {r[0] for r in db.execute("select view_name from duckdb_views() where not internal").fetchall()}
    assert views == {t.name for t in PARQUET_TABLES}
    # the cause tables are the database's own (analyze.open filled them)
    tables = {r[0] for r in db.execute("select table_name from duckdb_tables()").fetchall()}
    assert tables == {t.name for t in CAUSE_TABLES} | {"build_info"}
    assert db.execute("select count(*) from overlap").fetchone() != (0,)


# what each input fills besides the phase model's tables: devices (CUDA), metrics and energy,
# the Chrome trace JSON's own tables
OTHER_READERS = {
    "scorep/casita-2_cuda_simple": {"device_phases"},
    "scorep-metrics/mi300-rocm-smi-energy": {"metrics", "power", "energy_phases", "device_phases"},
    "kineto/hta_sampled_2rank": {"chrome_events", "chrome_files", "correlations", "device_phases"},
}


@pytest.mark.parametrize("source", ["literal", *OTHER_READERS])
def test_pyarrow_and_pandas_read_every_table_without_us(source: str, tmp_path: Path) -> None:
    """Any Parquet engine reads a run: pyarrow (what pandas, Dask and Spark's Python side read
    Parquet with) reads each table's folder as one dataset, hive partitions included, and
    gets the view's rows, from the codec's files (delta-encoded integers, dictionary text,
    JSON) and DuckDB's alike."""
    import pandas as pd
    import pyarrow.dataset as ds

    if source == "literal":
        run = literal_run(tmp_path / "run")
    else:
        run = tmp_path / "run"
        shutil.copytree(ROOT / "tests" / "fixtures" / source, run)
    db = analyze.open(run)
    link = run / "tables"
    filled = set()
    reader = duckdb.connect()
    for table in PARQUET_TABLES:
        arrow = ds.dataset(link / table.name, format="parquet",
                           partitioning="hive" if table.partition_by else None).to_table()
        assert sorted(arrow.column_names) == sorted(table.names), table.name
        cols = ", ".join(f"{c}::VARCHAR" for c in table.names)  # as text: TIMESTAMPTZ needs pytz
        reader.register("read_by_pyarrow", arrow)
        got = reader.execute(f"select {cols} from read_by_pyarrow order by all").fetchall()
        assert got == db.execute(f"select {cols} from {table.name} order by all").fetchall(), table.name
        assert len(pd.read_parquet(link / table.name)) == len(got), table.name
        if got:
            filled.add(table.name)
    assert {"intervals", "steps", "phases"} | OTHER_READERS.get(source, {"collectives", "p2p"}) <= filled


def doc_queries() -> list[tuple[str, str]]:
    """(file, query) for every SQL query in the README and docs/: ```sql blocks, backticked
    SELECT statements and ``db.sql("...")`` calls."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        found = re.findall(r"```sql\n(.*?)```", text, re.S)
        found += re.findall(r"`(SELECT\s[^`]*)`", text, re.S | re.I)
        found += re.findall(r"\.sql\(\"([^\"]*)\"\)", text)
        # line comments go before the lines are joined (they would swallow the rest)
        out += [(doc.name, " ".join(re.sub(r"--[^\n]*", "", q).split()).rstrip(";")) for q in found]
    return out


def batch_size_sweep(root: Path) -> Path:
    """test_compare's synthetic sweep with its model factor played by batch_size, which the
    query in docs/experiments.md groups by."""
    from tests.analyze.test_compare import synthetic_sweep

    sweep = synthetic_sweep(root)
    level = {"small": 16, "big": 32}
    for info_file in sweep.glob("*/run.json"):
        info = json.loads(info_file.read_text())
        info["factors"]["batch_size"] = level[info["factors"].pop("model")]
        info_file.write_text(json.dumps(info))
    meta = json.loads((sweep / "sweep.json").read_text())
    meta["factors"][0] = {"name": "batch_size", "levels": [16, 32]}
    (sweep / "sweep.json").write_text(json.dumps(meta))
    return sweep


def test_the_docs_queries_run_unchanged(run: Path, tmp_path: Path) -> None:
    from analyze.experiments import compare

    queries = doc_queries()
    # the ones we know of must be found, or the extraction silently tests nothing
    assert {"README.md", "horovod.md", "experiments.md", "scale.md"} <= {doc for doc, _ in queries}
    db = analyze.open(run)
    sweep = compare.compare(batch_size_sweep(tmp_path / "sweep")).db
    with duckdb.connect(str(sweep), read_only=True) as sweep_db:
        for doc, query in queries:
            target = sweep_db if re.search(r"\b(comparison|configurations)", query) else db
            rows = target.execute(query.replace(RUN_IN_DOCS, str(run))).fetchall()
            assert isinstance(rows, list), (doc, query)


def test_read_only_run_keeps_database_and_tables_in_the_cache(run: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    before = sorted(p.name for p in run.iterdir())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # tests run as root, for whom every directory is writable: play a read-only one
    monkeypatch.setattr(database.os, "access", lambda path, mode: Path(path) != run)
    paths = database.build(run)
    assert paths.db.parent == tmp_path / "cache" / "dltrace" / "analyze"
    assert paths.tables.is_symlink() and paths.tables.parent == paths.db.parent
    assert analyze.open(run).execute("select count(*) from steps").fetchone() == (4,)
    assert sorted(p.name for p in run.iterdir()) == before


def test_rebuilding_keeps_the_replaced_tables_until_the_next_build(run: Path) -> None:
    database.build(run)
    first = builds(run)
    held = analyze.open(run)  # a reader of the first build
    database.build(run, force=True)
    second = sorted(set(builds(run)) - set(first))
    assert held.execute("select count(*) from phases").fetchone() == (20,)  # still readable
    held.close()  # (DuckDB would hand this process the same open database again)
    database.build(run, force=True)
    third = sorted(set(builds(run)) - set(first) - set(second))
    assert len(first) == len(second) == len(third) == 1
    assert builds(run) == sorted(second + third)  # the first is gone, the one replaced kept
    assert os.readlink(run / "tables") == f".tables/{third[0]}"
    assert analyze.open(run).execute("select count(*) from phases").fetchone() == (20,)


def test_a_rebuild_removes_the_old_tables_once_its_stages_are_done(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # deleting them beside the read stage slowed a rebuild (their files' pages are freed while
    # the new ones are written): they go while the driver finishes alone
    from analyze.tables import stages

    database.build(run)
    database.build(run, force=True)
    first = builds(run)[0]
    seen: list[list[str]] = []
    real = stages.read

    def read(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(builds(run))
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "read", read)
    database.build(run, force=True)
    assert seen and all(first in names for names in seen)
    assert first not in builds(run) and len(builds(run)) == 2


def test_large_replaced_builds_are_removed_by_a_process_of_their_own(
        run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "REMOVE_IN_BACKGROUND_RANKS", 1)  # the run has 2 ranks
    for _ in range(3):
        database.build(run, force=True)
    deadline = time.monotonic() + 60
    while len(builds(run)) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(builds(run)) == 2 and not any(b.endswith(".removing") for b in builds(run))


def test_tables_of_dead_builds_are_removed_and_running_ones_kept(run: Path) -> None:
    host = socket.gethostname()
    (run / ".tables").mkdir()
    dead = run / ".tables" / f"18e000000000000-{host}-{2**22 + 12345}"  # above pid_max: never alive
    running = run / ".tables" / f"18e000000000001-{host}-{os.getpid()}"
    elsewhere = run / ".tables" / f"18e000000000002-otherhost-{2**22 + 12345}"
    for d in (dead, running, elsewhere):
        (d / "intervals").mkdir(parents=True)
    database.build(run)
    left = set(builds(run))
    assert dead.name not in left and running.name in left and elsewhere.name in left
    assert len(left) == 3


def test_intermediate_rows_are_removed_beside_the_build_and_their_leftovers_collected(run: Path) -> None:
    # a build removes its intermediate rows on a thread of its own, moved beside it first; it
    # is done when the build returns. What a killed process left is collected; what a running
    # one is removing is left to it
    host = socket.gethostname()
    (run / ".tables").mkdir()
    dead = run / ".tables" / f".18e000000000000-{host}-{2**22 + 12345}.work.removing"
    running = run / ".tables" / f".18e000000000001-{host}-{os.getpid()}.work.removing"
    for d in (dead, running):
        (d / "raw_collectives").mkdir(parents=True)
    database.build(run)
    left = builds(run)
    assert dead.name not in left and running.name in left
    assert len(left) == 2 and not (run / "tables" / "_work").exists()


def test_a_failed_build_keeps_the_previous_tables(run: Path) -> None:
    database.build(run)
    good = builds(run)
    evt = sorted((run / "traces").glob("*.evt"))[0]
    evt.write_bytes(evt.read_bytes()[:9])
    with pytest.raises(AnalyzeError, match="truncated or corrupt"):
        database.build(run, force=True)
    assert builds(run) == good  # the failed build's directory is gone, the old one intact
    assert not list(run.glob(".trace.duckdb.tmp*"))
    with duckdb.connect(str(run / "trace.duckdb"), read_only=True) as con:
        assert con.execute("select count(*) from phases").fetchone() == (20,)


def test_a_directory_of_the_users_in_the_way_is_left_alone(run: Path) -> None:
    (run / "tables").mkdir()
    (run / "tables" / "mine.txt").write_text("keep me")
    with pytest.raises(AnalyzeError, match="tables exists and is not the link"):
        database.build(run)
    assert (run / "tables" / "mine.txt").read_text() == "keep me"
    assert not (run / "trace.duckdb").exists() and not (run / ".tables").exists()
