"""What Horovod's background thread did in each step, from its imported timeline.

The Python side sees a Horovod collective from its enqueue to ``synchronize``; the phase model
therefore splits only the main thread's time (compute, allreduce, idle). Horovod's own
timeline (``DLTRACE_HOROVOD_TIMELINE=1``, imported as ``timeline`` locations of rank 0, see
docs/horovod.md) says what happened in between, on the coordinator:

- ``negotiate``: some tensor was being negotiated (from the first rank's request until every
  rank had asked for it: waiting for the slowest rank to reach the same gradient);
- ``fusion_copy``: the background thread copied tensors into or out of the fusion buffer;
- ``transfer``: it ran the collective itself (``GLOO_ALLREDUCE``, ``MPI_ALLREDUCE``, ...).

Each is the time covered (overlapping tensors count once) within each of rank 0's steps, so
``negotiate`` and ``transfer`` can be compared with the step and with the main thread's
``allreduce`` and ``idle`` phases. The three overlap one another in time across tensors (one
tensor is negotiated while another is reduced), so they do not add up to anything.
"""

from __future__ import annotations

import duckdb
import pandas as pd

ACTIVITIES = ("negotiate", "fusion_copy", "transfer")


def available(con: duckdb.DuckDBPyConnection) -> bool:
    row = con.execute("SELECT count(*) FROM locations WHERE kind = 'timeline' AND name LIKE 'horovod %'").fetchone()
    return bool(row and row[0])


def per_step(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per step of rank 0: step, step_ns, negotiate_ns, fusion_copy_ns, transfer_ns,
    and the main thread's allreduce_ns and idle_ns from ``phases`` (empty without a timeline)."""
    return con.execute("""
        WITH st AS (SELECT step, start_ns, end_ns FROM steps WHERE rank = 0),
        act AS (
            SELECT CASE
                     WHEN r.name LIKE 'horovod.NEGOTIATE%' THEN 'negotiate'
                     WHEN l.name LIKE 'horovod activities%'
                          AND (r.name LIKE '%MEMCPY%' OR r.name LIKE '%FUSION_BUFFER%') THEN 'fusion_copy'
                     WHEN l.name LIKE 'horovod activities%' THEN 'transfer'
                   END AS activity, i.start_ns, i.end_ns
            FROM intervals i JOIN locations l USING (location_id) JOIN regions r USING (region_id)
            WHERE l.kind = 'timeline' AND l.name LIKE 'horovod %' AND l.rank = 0),
        clipped AS (  -- each activity's part inside each step
            SELECT a.activity, s.step, greatest(a.start_ns, s.start_ns) AS t0, least(a.end_ns, s.end_ns) AS t1
            FROM act a JOIN st s ON a.start_ns < s.end_ns AND a.end_ns > s.start_ns
            WHERE a.activity IS NOT NULL),
        ordered AS (
            SELECT *, max(t1) OVER (PARTITION BY activity, step ORDER BY t0, t1
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM clipped),
        islands AS (  -- overlapping pieces merged: time covered, not summed
            SELECT *, sum(CASE WHEN reach IS NULL OR t0 > reach THEN 1 ELSE 0 END)
                        OVER (PARTITION BY activity, step ORDER BY t0, t1) AS island
            FROM ordered),
        covered AS (
            SELECT activity, step, sum(ns) AS ns FROM (
                SELECT activity, step, max(t1) - min(t0) AS ns FROM islands GROUP BY activity, step, island)
            GROUP BY activity, step),
        ph AS (SELECT step, sum(duration_ns) FILTER (WHERE phase = 'allreduce') AS allreduce_ns,
                      sum(duration_ns) FILTER (WHERE phase = 'idle') AS idle_ns
               FROM phases WHERE rank = 0 GROUP BY step)
        SELECT s.step, s.end_ns - s.start_ns AS step_ns,
               coalesce(sum(c.ns) FILTER (WHERE c.activity = 'negotiate'), 0)::BIGINT AS negotiate_ns,
               coalesce(sum(c.ns) FILTER (WHERE c.activity = 'fusion_copy'), 0)::BIGINT AS fusion_copy_ns,
               coalesce(sum(c.ns) FILTER (WHERE c.activity = 'transfer'), 0)::BIGINT AS transfer_ns,
               coalesce(any_value(ph.allreduce_ns), 0)::BIGINT AS allreduce_ns,
               coalesce(any_value(ph.idle_ns), 0)::BIGINT AS idle_ns
        FROM st s LEFT JOIN covered c USING (step) LEFT JOIN ph USING (step)
        WHERE EXISTS (SELECT 1 FROM act)
        GROUP BY s.step, s.start_ns, s.end_ns ORDER BY s.step
    """).df()


def summary(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Mean milliseconds per step of rank 0 and share of the step, one row per quantity."""
    steps = per_step(con)
    if steps.empty:
        return pd.DataFrame(columns=["rank 0, per step", "mean_ms", "% of step"])
    rows = [("step", "step_ns"), ("horovod negotiate", "negotiate_ns"),
            ("horovod fusion copies", "fusion_copy_ns"), ("horovod transfer", "transfer_ns"),
            ("main thread allreduce", "allreduce_ns"), ("main thread idle", "idle_ns")]
    total = steps["step_ns"].sum()
    return pd.DataFrame({
        "rank 0, per step": [label for label, _ in rows],
        "mean_ms": [round(steps[col].mean() / 1e6, 3) for _, col in rows],
        "% of step": [round(100.0 * steps[col].sum() / total, 1) if total else None for _, col in rows],
    })
