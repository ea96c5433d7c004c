"""The definitions' views a process's DuckDB holds for a build (stages._definition_views): made
once and seen by every task's cursor, and reading the files as they are when a query runs, so
the driver's rewrite of regions and communicators between the stages (the groups inferred from
names) reaches the later stages."""

from __future__ import annotations

from pathlib import Path

import duckdb

from analyze.schema import COMMUNICATORS, LOCATIONS, REGIONS
from analyze.tables import stages


def _write(con: duckdb.DuckDBPyConnection, spec: stages.Spec, regions: list[tuple[int, str]]) -> None:
    for table in (LOCATIONS, REGIONS, COMMUNICATORS):
        con.execute(table.ddl())
    con.executemany("INSERT INTO regions (region_id, name) VALUES (?, ?)", regions)
    for table in (LOCATIONS, REGIONS, COMMUNICATORS):
        for old in spec.store.dir(table).glob("*.parquet"):  # as the build's _write replaces them
            old.unlink()
        spec.store.write(con, table, f"SELECT * FROM {table.name}", "data")
        con.execute(f"DROP TABLE {table.name}")


def test_made_once_seen_by_every_cursor_and_rewrites_reach_them(tmp_path: Path) -> None:
    spec = stages.Spec(anchor="", root=str(tmp_path / "build"), reader="native", global_offset=0, resolution=1,
                       buckets=1)
    driver = duckdb.connect()
    _write(driver, spec, [(1, "a"), (2, "b")])
    try:
        first = stages._connect(spec)
        stages._definition_views(spec)
        base = stages._instances[spec.root]
        made = base.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()
        stages._definition_views(spec)  # a second task: nothing new
        assert base.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone() == made == (3,)
        assert first.execute("SELECT name FROM regions ORDER BY region_id").fetchall() == [("a",), ("b",)]
        _write(driver, spec, [(1, "a"), (2, "b"), (3, "c")])  # the driver between two stages
        stages._definition_views(spec)
        later = stages._connect(spec)
        assert later.execute("SELECT name FROM regions ORDER BY region_id").fetchall() == [("a",), ("b",), ("c",)]
    finally:
        stages.release(spec.root)
        stages.settle()
    assert spec.root not in stages._defined  # a new instance for the same folder makes them again
