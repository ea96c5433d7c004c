"""Fill the cause tables: one windowed pass over the steps, then the per-run summaries."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import BY_NAME, Phase
from analyze.tables.causes import balance, critical_path, delays, overlap, region_time
from analyze.tables.causes.region_time import NO_REGION, NO_REGION_NAME
from analyze.tables.causes.window import StepIndex, windows

MAIN_SHARE = 0.9  # delay_totals.main_steps: the fewest steps holding this share of the idle


def insert(con: duckdb.DuckDBPyConnection, table: str, df: pd.DataFrame,
           region: tuple[str, str | None] | None = None) -> None:
    """Append ``df``'s columns (named as the table's) to ``table``. With ``region`` = (name
    column, category column), those two come from ``df.region_id`` through the regions table
    (names are decoded in SQL, not in Python)."""
    if df.empty:
        return
    picks = []
    for c in BY_NAME[table].columns:
        if region and c.name == region[0]:
            value = f"CASE WHEN d.region_id = {NO_REGION} THEN '{NO_REGION_NAME}' ELSE r.name END"
        elif region and c.name == region[1]:
            value = "r.category"
        else:
            value = f"d.{c.name}"
        picks.append(f"CAST({value} AS {c.type})")
    join = "LEFT JOIN regions r ON r.region_id = d.region_id" if region else ""
    con.register("cause_rows", df)
    try:
        con.execute(f"INSERT INTO {table} SELECT {', '.join(picks)} FROM cause_rows d {join}")
    finally:
        con.unregister("cause_rows")


def build_causes(con: duckdb.DuckDBPyConnection) -> None:
    """Fill overlap, delays, delay_totals, critical_path, critical_path_regions, step_balance
    and rank_balance from the run's steps, phases, collectives and messages."""
    con.begin()  # one transaction: one write of the log instead of one per statement
    try:
        _build(con)
    except BaseException:
        con.rollback()
        raise
    con.commit()


REGION_COLUMNS: dict[str, tuple[str, str | None]] = {
    "delays": ("cause_region", "cause_category"),
    "critical_path_regions": ("region", "category"),
    "step_balance": ("critical_region", None),
}
BATCH_ROWS = 500_000  # rows gathered before an insert: few statements, bounded memory


class Batches:
    """Rows for each table, inserted a batch at a time (each statement has a fixed cost)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self.parts: dict[str, list[pd.DataFrame]] = {}
        self.rows: dict[str, int] = {}

    def add(self, table: str, df: pd.DataFrame) -> None:
        if df.empty:
            return
        self.parts.setdefault(table, []).append(df)
        self.rows[table] = self.rows.get(table, 0) + len(df)
        if self.rows[table] >= BATCH_ROWS:
            self.flush(table)

    def flush(self, table: str | None = None) -> None:
        for name in [table] if table else list(self.parts):
            parts = self.parts.pop(name, [])
            self.rows.pop(name, None)
            if parts:
                df = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
                insert(self.con, name, df, REGION_COLUMNS.get(name))


def _build(con: duckdb.DuckDBPyConnection) -> None:
    steps = StepIndex(con)
    batches = Batches(con)
    summaries = []  # per rank and step: what rank_balance's medians need, a few integers a row
    for win in windows(con, steps):
        batches.add("overlap", overlap.window_overlap(win))
        idle = delays.idle_waits(win)
        chain, ends = critical_path.window_paths(win, idle)
        summary = balance.step_summary(win)
        summaries.append(summary)
        _window_rows(con, batches, steps, delays.with_intervals(win, steps, idle), chain, ends, summary)
    batches.flush()
    _delay_totals(con)
    if summaries:
        insert(con, "rank_balance", balance.rank_balance(con, pd.concat(summaries, ignore_index=True)))


def _window_rows(con: duckdb.DuckDBPyConnection, batches: Batches, steps: StepIndex, w: pd.DataFrame,
                 chain: pd.DataFrame, ends: pd.DataFrame, summary: pd.DataFrame) -> None:
    """The delays, critical path and step balance rows of one window's steps. The time per
    region of its synchronization intervals and of its critical paths' stretches is summed in
    one statement per window, so memory follows the window, not the run (at 10^8 events a
    statement for the whole run peaked at 4 GB)."""
    rank, step, b, e = delays.queries(w, steps)
    times = region_time.region_times(
        con, np.concatenate([rank, chain["rank"].to_numpy(np.int64)]),
        np.concatenate([step, chain["step"].to_numpy(np.int64)]),
        np.concatenate([b, chain["start_ns"].to_numpy(np.int64)]),
        np.concatenate([e, chain["end_ns"].to_numpy(np.int64)]), steps.all)
    q = times["q"].to_numpy()
    batches.add("delays", delays.attribute(w, times[q < len(b)], steps))
    regions = critical_path.path_regions(chain, times[q >= len(b)].assign(q=q[q >= len(b)] - len(b)))
    batches.add("critical_path", chain)
    batches.add("critical_path_regions", regions)
    batches.add("step_balance", critical_path.step_balance(ends, chain, regions, summary))


def _delay_totals(con: duckdb.DuckDBPyConnection) -> None:
    """Per cause (rank, kind, region) across the run, largest first."""
    key = "cause_rank, cause_kind, cause_region, cause_category"
    same = " AND ".join(f"t.{k} IS NOT DISTINCT FROM m.{k}" for k in key.split(", "))
    con.execute(f"""
        INSERT INTO delay_totals
        WITH per_step AS (SELECT {key}, cause_step, sum(idle_ns) AS ns FROM delays GROUP BY ALL),
        ranked AS (
            SELECT *, sum(ns) OVER (PARTITION BY {key} ORDER BY ns DESC, cause_step
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - ns AS before,
                      sum(ns) OVER (PARTITION BY {key}) AS total
            FROM per_step
        ),
        m AS (
            SELECT {key}, list(cause_step ORDER BY cause_step)
                          FILTER (WHERE cause_step IS NOT NULL AND before < {MAIN_SHARE} * total) AS main_steps
            FROM ranked GROUP BY ALL
        ),
        t AS (
            SELECT {key}, sum(idle_ns) AS idle_ns, count(DISTINCT rank) AS waiting_ranks,
                   count(DISTINCT cause_step) AS steps, min(cause_step) AS first_step,
                   max(cause_step) AS last_step
            FROM delays GROUP BY ALL
        )
        SELECT t.cause_rank, t.cause_kind, t.cause_region, t.cause_category, t.idle_ns,
               t.idle_ns / (SELECT nullif(sum(duration_ns), 0) FROM phases WHERE phase = '{Phase.IDLE}'),
               t.waiting_ranks, t.steps, t.first_step, t.last_step, coalesce(m.main_steps, [])
        FROM t JOIN m ON {same}
        ORDER BY t.idle_ns DESC, t.cause_rank, t.cause_region
    """)
