"""Fill the cause tables: one windowed pass over the steps, then the per-run summaries."""

from __future__ import annotations

import duckdb
import pandas as pd

from analyze.schema import BY_NAME, Phase
from analyze.tables.causes import balance, critical_path, delays, overlap
from analyze.tables.causes.window import NO_REGION, NO_REGION_NAME, StepIndex, windows

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


def _build(con: duckdb.DuckDBPyConnection) -> None:
    steps = StepIndex(con)
    summaries = []
    for win in windows(con, steps):
        insert(con, "overlap", overlap.window_overlap(win))
        waits = delays.idle_waits(win)
        insert(con, "delays", delays.attribute(win, steps, waits), ("cause_region", "cause_category"))
        chain, regions, path_ends = critical_path.window_paths(win, waits)
        insert(con, "critical_path", chain)
        insert(con, "critical_path_regions", regions, ("region", "category"))
        summary = balance.step_summary(win)
        insert(con, "step_balance", critical_path.step_balance(path_ends, chain, regions, summary),
               ("critical_region", None))
        summaries.append(summary)
    _delay_totals(con)
    if summaries:
        insert(con, "rank_balance", balance.rank_balance(con, pd.concat(summaries, ignore_index=True)))


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
