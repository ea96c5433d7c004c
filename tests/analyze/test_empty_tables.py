"""A table without rows still gets one file (Store.write_empty): written by the codec where
it writes every column type, with the same columns, types and nullability DuckDB's own empty
file has, so readers see no difference; by DuckDB for the rest (JSON lists, timestamps)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from analyze.schema import TABLES
from analyze.tables import store as store_module
from analyze.tables.store import Store
from traceio import codec

pytestmark = pytest.mark.skipif(not codec.available(), reason="native codec not built")


def _schema(path: Path) -> list[tuple]:
    con = duckdb.connect()
    cols = con.execute(f"describe select * from read_parquet('{path}')").fetchall()
    rows = con.execute(f"select count(*) from read_parquet('{path}')").fetchone()
    # the file's own view of nullability (DuckDB's describe says YES for every column)
    reps = con.execute(f"select name, repetition_type from parquet_schema('{path}') where type is not null").fetchall()
    return [(c[0], c[1]) for c in cols] + [rows] + reps  # type: ignore[list-item]


def _file(root: Path, table) -> Path:  # type: ignore[no-untyped-def]
    found = list((root / table.name).rglob("*.parquet"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_an_empty_table_reads_as_duckdb_writes_it(table, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    con = duckdb.connect()
    ours, theirs = Store(tmp_path / "ours"), Store(tmp_path / "theirs")
    ours.write_empty(con, table)
    monkeypatch.setattr(store_module.codec, "native", lambda: None)  # DuckDB's COPY, as without the codec
    theirs.write_empty(con, table)
    mine, duck = _file(ours.root, table), _file(theirs.root, table)
    assert mine.relative_to(ours.root) == duck.relative_to(theirs.root)  # rank=0/ for per-rank tables
    assert _schema(mine) == _schema(duck)
    # the codec wrote it exactly when it writes every column type the table has
    by_codec = all(c.type in store_module._EMPTY_KINDS for c in table.columns if c.name != table.partition_by)
    assert (store_module.CREATED_BY.encode() in mine.read_bytes()) == by_codec
