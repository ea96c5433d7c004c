"""Training steps per rank: our step markers, a user-named region, or the whole run.

In that order of preference: ``dltrace.step`` regions (the built-in tracer's and, as
``user:dltrace.step``, the Score-P backend's); otherwise the outermost instances of the region
named by ``--step-region`` on each rank's main thread; otherwise one step spanning each
rank's whole trace.
"""

from __future__ import annotations

import duckdb

from analyze.schema import Category


def build_steps(con: duckdb.DuckDBPyConnection, step_region: str | None = None) -> str:
    """Fill ``steps``; return the source used (marker, region:<name> or whole_run)."""
    if step_region is None:
        con.execute(f"""
            INSERT INTO steps
            SELECT i.rank, row_number() OVER (PARTITION BY i.rank ORDER BY i.start_ns) - 1,
                   i.start_ns, i.end_ns, i.end_ns - i.start_ns, 'marker'
            FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
            WHERE l.is_main AND r.category = '{Category.STEP}'
        """)
        if _count(con):
            return "marker"
    else:
        source = f"region:{step_region}"
        con.execute("""
            INSERT INTO steps
            WITH c AS (
                SELECT i.* FROM intervals i JOIN regions r USING (region_id)
                JOIN locations l USING (location_id)
                WHERE l.is_main AND (r.name = $name OR r.name = 'user:' || $name)
            ),
            outer_only AS (
                SELECT c.* FROM c WHERE NOT EXISTS (
                    SELECT 1 FROM c o WHERE o.location_id = c.location_id AND o.idx <> c.idx
                      AND o.start_ns <= c.start_ns AND o.end_ns >= c.end_ns AND o.depth < c.depth)
            )
            SELECT rank, row_number() OVER (PARTITION BY rank ORDER BY start_ns) - 1,
                   start_ns, end_ns, end_ns - start_ns, $source
            FROM outer_only
        """, {"name": step_region, "source": source})
        if _count(con):
            return source
    con.execute("""
        INSERT INTO steps
        SELECT rank, 0, min(start_ns), max(end_ns), max(end_ns) - min(start_ns), 'whole_run'
        FROM intervals GROUP BY rank
    """)
    return "whole_run"


def _count(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT count(*) FROM steps").fetchone()
    return int(row[0]) if row else 0
