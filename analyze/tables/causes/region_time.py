"""How long a rank spent in each region between two instants (exclusive time), in SQL.

For a query [b, e) on a rank, inside one of its steps, over the main thread's region
instances that start in that step and overlap the query: an instance inside the query adds
its exclusive time (``intervals.exclusive_ns``: its children are inside too); one crossing an
end of the query (only those open at b or e) adds its overlap minus its children's overlaps.
An instance ends, here, where its exclusive time does: a Chrome trace's slice that a later one
only partly overlaps ends where that one starts (``chrome_events.own_end_ns``), as on a call
stack, so the instances nest and every instant counts once.
Nested regions so count once, as the innermost, and the work per query is that of one step.
A step region nested in others (``--step-region``) has its ancestors outside the step, which
hold no time inside it. Time inside no instance is :data:`NO_REGION`. All the queries of a
window of steps go in one statement (:mod:`.build`).
"""

from __future__ import annotations

from collections.abc import Mapping

import duckdb
import numpy as np
import pandas as pd

from analyze.tables.causes.window import all_steps

NO_REGION = -1  # time on the main thread inside no region
NO_REGION_NAME = "(no region)"


def bucket_ns(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """Width of the time buckets steps are found by: about a median step, and never so
    narrow that a step spans more than about 10^5 of them. (Only the statement's speed
    depends on it.)"""
    if not len(start_ns):
        return 1
    return max(1, int(np.median(end_ns - start_ns)), int(end_ns.max() - start_ns.min()) // 100_000)


def region_times(con: duckdb.DuckDBPyConnection, rank: np.ndarray, step: np.ndarray, b: np.ndarray,
                 e: np.ndarray, steps: Mapping[str, np.ndarray] | None = None) -> pd.DataFrame:
    """Exclusive time per region in [b[q], e[q]) on rank[q], inside its step step[q]
    (-1: outside every step, all of it in no region): columns q, region (region_id or
    :data:`NO_REGION`), ns. Each query's rows sum to e - b. ``steps``: the run's steps as
    columns rank, step, start_ns, end_ns (window.all_steps), when the caller holds them; else
    they are read (at 4,096 ranks, scanning the steps' files took 2 of the statement's 6
    CPU-seconds)."""
    n = len(b)
    b = np.asarray(b, np.int64)
    e = np.maximum(np.asarray(e, np.int64), b)
    if n == 0:
        return pd.DataFrame({"q": np.zeros(0, np.int64), "region": np.zeros(0, np.int64),
                             "ns": np.zeros(0, np.int64)})
    if steps is None:
        steps = all_steps(con)
    queries = pd.DataFrame({"q": np.arange(n), "rank": np.asarray(rank, np.int64),
                            "step": np.asarray(step, np.int64), "b": b, "e": e})
    # only the queries' own steps: all of a long run's steps, registered for each window, took
    # 0.5 GB more at the peak of the cause tables at 10^8 events (893k steps, 21 windows)
    wanted = _rows_of(np.asarray(steps["rank"], np.int64) << 32 | np.asarray(steps["step"], np.int64),
                      queries["rank"].to_numpy() << 32 | queries["step"].to_numpy())
    steps = {c: np.asarray(steps[c], np.int64)[wanted] for c in ("rank", "step", "start_ns", "end_ns")}
    con.register("region_time_queries", queries)
    con.register("region_time_steps", pd.DataFrame(steps))
    try:
        got = con.execute("""
            WITH q AS (SELECT * FROM region_time_queries WHERE step >= 0 AND e > b),
            iv AS (
                SELECT i.rank, i.idx, i.parent_idx, i.region_id, i.start_ns, {end} AS end_ns, i.exclusive_ns
                FROM intervals i {cut}
                WHERE i.location_id IN (SELECT location_id FROM locations WHERE is_main)
                  -- constants, not subqueries over q: those make DuckDB plan the joins badly
                  AND i.end_ns > $lo AND i.start_ns < $hi
            ),
            -- each instance with the step it starts in: an equi-join on time buckets about a
            -- step long (each step listed under the buckets it overlaps), several times faster
            -- than an ASOF join on this many rows
            sb AS (
                SELECT rank, step, start_ns, end_ns, unnest(range(start_ns // $w, end_ns // $w + 1)) AS bucket
                FROM region_time_steps SEMI JOIN q USING (rank, step)
            ),
            ivs AS (
                SELECT iv.*, sb.step FROM iv JOIN sb ON sb.rank = iv.rank AND sb.bucket = iv.start_ns // $w
                WHERE iv.start_ns >= sb.start_ns AND iv.start_ns < sb.end_ns
            ),
            j AS (
                SELECT q.q, ivs.idx, ivs.parent_idx, ivs.region_id, ivs.exclusive_ns,
                       least(ivs.end_ns, q.e) - greatest(ivs.start_ns, q.b) AS ov,
                       ivs.start_ns >= q.b AND ivs.end_ns <= q.e AS inside
                FROM q JOIN ivs ON ivs.rank = q.rank AND ivs.step = q.step
                WHERE ivs.start_ns < q.e AND ivs.end_ns > q.b
            ),
            kids AS (SELECT q, parent_idx, sum(ov) AS ov FROM j WHERE parent_idx IS NOT NULL GROUP BY q, parent_idx),
            parts AS (
                -- an instance inside the query: its exclusive time (its children are inside too)
                SELECT q, region_id, exclusive_ns AS ns FROM j WHERE inside
                UNION ALL
                -- one crossing an end of it (few: the ones open there): its part minus its children's
                SELECT j.q, j.region_id, j.ov - coalesce(k.ov, 0)
                FROM j LEFT JOIN kids k ON k.q = j.q AND k.parent_idx = j.idx WHERE NOT j.inside
            )
            SELECT q, region_id AS region, sum(ns) AS ns FROM parts GROUP BY q, region_id HAVING sum(ns) <> 0
        """.format(**_ENDS[cut_ends(con)]),
            {"lo": int(b.min()), "hi": int(e.max()), "w": bucket_ns(steps["start_ns"], steps["end_ns"])}).fetchnumpy()
    finally:
        con.unregister("region_time_queries")
        con.unregister("region_time_steps")
    q = np.asarray(got["q"], np.int64)
    region = np.asarray(got["region"], np.int64)
    ns = np.asarray(got["ns"], np.int64)
    rest = (e - b) - np.bincount(q, weights=ns, minlength=n).astype(np.int64)
    more = np.flatnonzero(rest > 0)
    return pd.DataFrame({"q": np.concatenate([q, more]),
                         "region": np.concatenate([region, np.full(len(more), NO_REGION)]),
                         "ns": np.concatenate([ns, rest[more]])})


# Where an instance's exclusive time ends: its end, or where a Chrome trace's later slice that only
# partly overlaps it starts (chrome_events.own_end_ns): cut there, the instances nest
_ENDS = {False: {"end": "i.end_ns", "cut": ""},
         True: {"end": "coalesce(c.own_end_ns, i.end_ns)",
                "cut": "LEFT JOIN chrome_events c ON c.location_id = i.location_id AND c.idx = i.idx"}}


def cut_ends(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether any instance's exclusive time ends before it does (only in Chrome traces
    whose slices partly overlap)."""
    return con.execute("SELECT count(*) > 0 FROM chrome_events WHERE own_end_ns IS NOT NULL").fetchall() == [(True,)]


def _rows_of(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The rows of ``keys`` (every row of a key it holds twice) whose key is among ``wanted``,
    in order. The run's steps come sorted by (rank, step): a binary search for each distinct
    wanted key then, rather than ``np.isin``, which sorts all of them again (45 ms per window
    at 10^8 events, 893k steps, against 8 ms)."""
    if len(keys) and not (keys[1:] >= keys[:-1]).all():
        return np.flatnonzero(np.isin(keys, wanted))
    wanted = np.unique(wanted)
    first, last = np.searchsorted(keys, wanted, "left"), np.searchsorted(keys, wanted, "right")
    count = last - first
    return np.arange(int(count.sum())) + np.repeat(first - (np.cumsum(count) - count), count)
