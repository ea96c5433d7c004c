"""Name patterns change nothing an OTF2 record already says: the real Score-P fixtures and a
trace of our own give exactly the tables they gave before the pattern table existed.

``golden/tables-before-patterns.json`` was written by this module's ``__main__`` on the
tip of issue 15 (a6503a0: the commit before the pattern table, f17e6fe, plus the device side,
which classifies kernels by their role), for every table in ``analyze.schema.TABLES``: the
columns the table had then, its row count and a SHA-256 of its rows (each value cast to
text, sorted). Columns added since (``regions.pattern_op``, ``collectives.source``, ...) are checked here
to say what they must say for traces without library names: nothing.

    PYTHONPATH=. python -m tests.analyze.test_tables_unchanged   # rewrite the golden file
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

import analyze
from analyze.schema import TABLES

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden") / "tables-before-patterns.json"
FIXTURES = [ROOT / "tests" / "fixtures" / d / name for d, name in (
    ("scorep", "pipit-pingpong"), ("scorep", "sstelements-bcast4"), ("scorep", "casita-2_cuda_simple"),
    ("scorep-metrics", "mi300-rocm-smi-energy"), ("scorep-metrics", "pipit-pingpong-papi"))]
# where the archive is, which reader read it and the schema's version number are not results
NOT_RESULTS = {"runs": {"path", "reader", "schema_version"}}
SYNTH_EVENTS = 20_000  # bench.synth: a DDP-like trace of our own writer (markers, lanes, waits)


def digest(db: duckdb.DuckDBPyConnection, table: str, columns: list[str]) -> dict[str, Any]:
    db.execute("SET TimeZone = 'UTC'")  # runs.start_realtime as text, the same everywhere
    values = ", ".join(f"CAST({c} AS VARCHAR)" for c in columns)
    rows = db.execute(f"SELECT {values} FROM {table} ORDER BY ALL").fetchall()
    text = "\n".join("\t".join(str(v) for v in row) for row in rows)
    return {"columns": columns, "rows": len(rows), "sha256": hashlib.sha256(text.encode()).hexdigest()}


def digests(db: duckdb.DuckDBPyConnection, columns: dict[str, list[str]] | None = None) -> dict[str, Any]:
    out = {}
    for table in TABLES:
        cols = (columns or {}).get(table.name) or [
            c for c in table.names if c not in NOT_RESULTS.get(table.name, set())]
        out[table.name] = digest(db, table.name, cols)
    return out


def traces(tmp: Path) -> dict[str, Path]:
    from bench import synth

    runs = {p.name: p for p in FIXTURES}
    runs["synth"], _ = synth.write(SYNTH_EVENTS, tmp / "synth")
    return runs


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", [p.name for p in FIXTURES] + ["synth"])
def test_tables_are_the_same_as_before_patterns(name: str, golden: dict[str, Any], tmp_path: Path) -> None:
    run = traces(tmp_path)[name] if name == "synth" else {p.name: p for p in FIXTURES}[name]
    db = analyze.open(run, db=tmp_path / "t.duckdb")
    before = golden[name]
    now = {t: digest(db, t, before[t]["columns"]) for t in before}  # tables added since: not compared
    assert now == before
    # what the new columns say when no region name is a library's: nothing by pattern
    assert db.execute("SELECT count(*) FROM collectives WHERE source <> 'record'").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM regions WHERE rule = 'pattern' OR pattern_op IS NOT NULL").fetchone() == (0,)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = {}
        for name, run in traces(Path(tmp)).items():
            result[name] = digests(analyze.open(run, db=Path(tmp) / f"{name}.duckdb"))
    GOLDEN.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}", file=sys.stderr)
