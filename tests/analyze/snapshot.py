"""Every table of a run's database, for tests that compare builds (readers, engines)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from analyze.schema import TABLES

# build_info keys that say how, where and how fast a build ran, not what it found
HOW = ("signature", "tables", "engine", "engine_workers", "stages", "read_seconds", "derive_seconds")


def snapshot(db: Path, *, runs_exclude: str = "") -> dict[str, list[tuple]]:
    """Table name -> its rows, sorted: every table of the schema and build_info (without the
    keys in :data:`HOW`); ``runs_exclude``: columns of ``runs`` to leave out."""
    with duckdb.connect(str(db), read_only=True) as con:
        out = {}
        for table in TABLES:
            select = "select *"
            if table.name == "runs":  # TIMESTAMPTZ values need pytz in Python: compare them as text
                exclude = f" exclude ({runs_exclude})" if runs_exclude else ""
                select = f"select *{exclude} replace (start_realtime::VARCHAR as start_realtime)"
            out[table.name] = con.execute(f"{select} from {table.name} order by all").fetchall()
        keys = ", ".join(f"'{k}'" for k in HOW)
        out["build_info"] = con.execute(
            f"select * from build_info where key not in ({keys}) order by all").fetchall()
        return out
