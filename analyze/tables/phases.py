"""Split each rank's steps into phases: compute, allreduce, other_comm, idle, other.

The model (docs/phase-model.md has the reasoning):

1. On the rank's main thread, a collective or point-to-point region is communication: idle
   while waiting for a late rank (see :mod:`analyze.tables.collectives`), then ``allreduce`` or
   ``other_comm`` by operation.
2. Measurement overhead and runtime setup (buffer flushes, MPI_Init) are ``other``.
3. An asynchronous collective (on a communication lane or another thread) is communication
   only where the main thread waits for it (a wait region) or is in no compute region
   (forward, backward, optimizer, data loading); where the main thread computes meanwhile,
   the communication is hidden and the time is compute.
4. A wait recognized by a name pattern (``Al::Wait``, ``hvd.synchronize``: no asynchronous
   collective in the trace explains it) is communication for what the rules above leave of
   it: ``allreduce`` when its region's op says so, else ``other_comm``. Our own wait markers
   (``ddp.wait_for_buckets``) only reveal the asynchronous collectives they wait for.
5. Everything else inside a step is compute.

Implementation: every rule contributes segments at a level; a sweep over the sorted segment
boundaries gives, for each elementary interval, which levels cover it; the first matching
rule names its phase. Step boundaries are boundaries too, so each elementary interval lies
in at most one step and the phases of a step sum to its duration exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import COMPUTE_CATEGORIES, Category, Phase, Rule
from analyze.tables.collectives import index_of, position
from analyze.tables.steps import rank_group_sql
from traceio import codec

# Levels of the sweep.
SYNC_IDLE, SYNC_ALLREDUCE, SYNC_OTHER, OTHER, WAIT, COMPUTE, ASYNC_IDLE, ASYNC_ALLREDUCE, ASYNC_OTHER = range(9)
NAMED_WAIT_ALLREDUCE, NAMED_WAIT_OTHER = 9, 10  # waits recognized by name (rule 4)
N_LEVELS = 11
PHASES = [Phase.COMPUTE, Phase.ALLREDUCE, Phase.OTHER_COMM, Phase.IDLE, Phase.OTHER]
PHASE_NAMES = tuple(str(p) for p in PHASES)  # by code
# the regions of a main thread that give segments (the others count as compute)
SEGMENT_CATEGORIES = (Category.COLLECTIVE, Category.P2P, Category.OVERHEAD, Category.RUNTIME,
                      Category.WAIT, *COMPUTE_CATEGORIES)
_CODE = {p: i for i, p in enumerate(PHASES)}


def label(cover: np.ndarray) -> np.ndarray:
    """Phase codes (index into :data:`PHASES`) from a (levels x n) boolean cover matrix."""
    waiting = cover[WAIT] | cover[NAMED_WAIT_ALLREDUCE] | cover[NAMED_WAIT_OTHER]
    hidden = cover[COMPUTE] & ~waiting  # async communication overlapped by compute
    conditions = [
        cover[SYNC_IDLE],
        cover[SYNC_ALLREDUCE],
        cover[SYNC_OTHER],
        cover[OTHER],
        cover[ASYNC_IDLE] & ~hidden,
        cover[ASYNC_ALLREDUCE] & ~hidden,
        cover[ASYNC_OTHER] & ~hidden,
        cover[NAMED_WAIT_ALLREDUCE],
        cover[NAMED_WAIT_OTHER],
    ]
    choices = [_CODE[Phase.IDLE], _CODE[Phase.ALLREDUCE], _CODE[Phase.OTHER_COMM], _CODE[Phase.OTHER],
               _CODE[Phase.IDLE], _CODE[Phase.ALLREDUCE], _CODE[Phase.OTHER_COMM],
               _CODE[Phase.ALLREDUCE], _CODE[Phase.OTHER_COMM]]
    return np.select(conditions, choices, default=_CODE[Phase.COMPUTE])


@functools.cache
def _mask_codes() -> bytes:
    """The phase code of every set of covering levels (bit ``level`` of the index set): the
    rules of :func:`label` as a table, for the native sweep."""
    masks = np.arange(1 << N_LEVELS)
    cover = ((masks[None, :] >> np.arange(N_LEVELS)[:, None]) & 1).astype(bool)
    return label(cover).astype(np.uint8).tobytes()


def elementary(
    seg_start: np.ndarray, seg_end: np.ndarray, seg_level: np.ndarray,
    step_start: np.ndarray, step_end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bounds, codes, steps): the sorted boundaries of segments and steps, and for each
    elementary interval [bounds[i], bounds[i+1]) its phase code and the index of the step
    holding it (-1: none).

    One sort gives the boundaries and where every segment and step starts and ends among
    them; a level covers an interval where more of its segments have started than ended.
    """
    keep = seg_end > seg_start
    seg_start, seg_end, seg_level = seg_start[keep], seg_end[keep], seg_level[keep]
    n, k = len(seg_start), len(step_start)
    bounds, at = _unique_inverse(np.concatenate([seg_start, seg_end, step_start, step_end]))
    m = len(bounds)
    if m < 2:
        return bounds, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts, ends = at[:n], at[n:2 * n]
    cover = np.zeros((N_LEVELS, m - 1), dtype=bool)
    for level in np.unique(seg_level):
        mine = seg_level == level
        delta = np.bincount(starts[mine], minlength=m) - np.bincount(ends[mine], minlength=m)
        cover[level] = np.cumsum(delta)[: m - 1] > 0
    order = np.argsort(step_start, kind="stable")
    if k and bool(np.all(step_start[order][1:] >= step_end[order][:-1])):
        # disjoint steps: step j adds j + 1 from its start to its end
        weight = np.arange(1, k + 1, dtype=np.float64)
        mark = (np.bincount(at[2 * n:2 * n + k], weights=weight, minlength=m)
                - np.bincount(at[2 * n + k:], weights=weight, minlength=m))
        step = np.rint(np.cumsum(mark)[: m - 1]).astype(np.int64) - 1
    else:
        step = _step_of(bounds[:-1], step_start, step_end)
    return bounds, label(cover), step


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``, by a stable sort: the boundaries come as a
    few runs that are each nearly sorted (starts, ends, steps), which a stable sort (timsort
    for int64) merges in about half the time of the quicksort np.unique uses."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    new = np.empty(len(ordered), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    inverse = np.empty(len(values), dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


def _step_of(left: np.ndarray, step_start: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """Index of the step containing each elementary interval starting at ``left``, or -1
    (for overlapping steps: the last one started)."""
    if not len(step_start):
        return np.full(len(left), -1, dtype=np.int64)
    order = np.argsort(step_start)
    pos = np.searchsorted(step_start[order], left, side="right") - 1
    step = np.where(pos >= 0, order[np.clip(pos, 0, None)], -1)
    inside = (step >= 0) & (left < step_end[np.clip(step, 0, None)])
    return np.where(inside, step, -1)


def sweep(
    seg_start: np.ndarray, seg_end: np.ndarray, seg_level: np.ndarray,
    step_start: np.ndarray, step_end: np.ndarray,
) -> np.ndarray:
    """Per step, ns per phase: an array (n_steps x len(PHASES)) of int64.

    Segments are half-open [start, end) at a level; steps must not overlap.
    """
    n_steps = len(step_start)
    if n_steps == 0:
        return np.zeros((0, len(PHASES)), dtype=np.int64)
    native = codec.native()
    if native is not None:  # the same sweep in C (traceio/native/sweep.c), for disjoint steps
        totals = native.phase_sweep(*(np.ascontiguousarray(a, dtype=np.int64) for a in
                                      (seg_start, seg_end, seg_level, step_start, step_end)),
                                    _mask_codes(), len(PHASES))
        if totals is not None:
            return np.frombuffer(totals, dtype=np.int64).reshape(n_steps, len(PHASES)).copy()
    return sweep_numpy(seg_start, seg_end, seg_level, step_start, step_end)


def sweep_numpy(
    seg_start: np.ndarray, seg_end: np.ndarray, seg_level: np.ndarray,
    step_start: np.ndarray, step_end: np.ndarray,
) -> np.ndarray:
    """:func:`sweep` in numpy (without the native codec, and for overlapping steps)."""
    n_steps = len(step_start)
    out = np.zeros((n_steps, len(PHASES)), dtype=np.int64)
    if n_steps == 0:
        return out
    bounds, codes, step = elementary(seg_start, seg_end, seg_level, step_start, step_end)
    if len(codes) == 0:
        return out
    valid = step >= 0
    flat = step[valid] * len(PHASES) + codes[valid]
    out += np.bincount(flat, weights=np.diff(bounds)[valid], minlength=n_steps * len(PHASES)).astype(
        np.int64).reshape(n_steps, len(PHASES))
    return out


def sweep_intervals(
    seg_start: np.ndarray, seg_end: np.ndarray, seg_level: np.ndarray,
    step_start: np.ndarray, step_end: np.ndarray,
) -> pd.DataFrame:
    """The phase timeline inside the steps: start_ns, end_ns, phase, step (index into the
    step arrays), with adjacent pieces of the same phase and step merged."""
    bounds, codes, step = elementary(seg_start, seg_end, seg_level, step_start, step_end)
    keep = step >= 0
    if not keep.any():  # nothing inside a step (e.g. only zero-length steps)
        return pd.DataFrame({"start_ns": [], "end_ns": [], "phase": [], "step": []})
    left, right, codes, step = bounds[:-1][keep], bounds[1:][keep], codes[keep], step[keep]
    # a new run starts where the phase or the step changes, or where there is a gap
    new = np.ones(len(codes), dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (step[1:] != step[:-1]) | (left[1:] != right[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(codes)) - 1
    return pd.DataFrame({"start_ns": left[starts], "end_ns": right[ends],
                         "phase": np.array(PHASE_NAMES, dtype=object)[codes[starts]], "step": step[starts]})


def sweep_intervals_of_ranks(segs: pd.DataFrame, steps: pd.DataFrame, t0: int, t1: int) -> pd.DataFrame:
    """:func:`sweep_intervals` of every rank of ``steps`` (rank, start_ns, end_ns; inside
    [t0, t1]) with their ``segs`` (:func:`segments`' columns): start_ns, end_ns, phase, rank,
    by rank, then time.

    One sweep for all ranks, not one per rank (4,096 ranks: 5 s of calls): each rank's times
    are moved to a span of their own, ``[r * (t1 - t0 + 1), ...)`` for the r-th rank, after
    clipping the segments to [t0, t1] (which changes nothing inside a step). Where those
    spans would not fit in int64, rank by rank."""
    ranks = np.unique(steps["rank"].to_numpy(np.int64))
    span = int(t1) - int(t0) + 1
    columns = ["start_ns", "end_ns", "phase", "rank"]
    if not len(ranks):
        return pd.DataFrame({c: [] for c in columns})
    if span <= 0 or len(ranks) * span >= 1 << 62:
        parts = []
        for rank, rs in steps.groupby("rank"):
            s = segs[segs["rank"] == rank]
            iv = sweep_intervals(s["start"].to_numpy(np.int64), s["end"].to_numpy(np.int64),
                                 s["level"].to_numpy(np.int64), rs["start_ns"].to_numpy(np.int64),
                                 rs["end_ns"].to_numpy(np.int64))
            parts.append(iv.assign(rank=rank)[columns])
        return pd.concat(parts, ignore_index=True)
    seg_rank = segs["rank"].to_numpy(np.int64)
    row = np.searchsorted(ranks, seg_rank)
    mine = ranks[np.minimum(row, len(ranks) - 1)] == seg_rank  # segments of ranks with steps only
    base = row[mine] * span - int(t0)
    seg_start = np.clip(segs["start"].to_numpy(np.int64)[mine], t0, t1) + base
    seg_end = np.clip(segs["end"].to_numpy(np.int64)[mine], t0, t1) + base
    step_rank = steps["rank"].to_numpy(np.int64)
    step_base = np.searchsorted(ranks, step_rank) * span - int(t0)
    iv = sweep_intervals(seg_start, seg_end, segs["level"].to_numpy(np.int64)[mine],
                         steps["start_ns"].to_numpy(np.int64) + step_base,
                         steps["end_ns"].to_numpy(np.int64) + step_base)
    at = iv["step"].to_numpy(np.int64)
    return pd.DataFrame({"start_ns": iv["start_ns"].to_numpy(np.int64) - step_base[at],
                         "end_ns": iv["end_ns"].to_numpy(np.int64) - step_base[at],
                         "phase": iv["phase"], "rank": step_rank[at]})


def split_by_rank(main: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
    """The columns of each rank, rows in their order (slices, not copies, when the rows come
    grouped by rank): one sort for every rank, not a mask per rank (which reads every row
    once per rank: seconds at 4,096 ranks)."""
    rank = main["rank"]
    if not len(rank):  # no main-thread communication or markers in the window (a Kineto trace's)
        return {}
    if (np.diff(rank) < 0).any():
        order = np.argsort(rank, kind="stable")
        main = {k: v[order] for k, v in main.items()}
        rank = main["rank"]
    values, first = np.unique(rank, return_index=True)
    last = np.append(first[1:], len(rank))
    return {int(r): {k: v[a:b] for k, v in main.items()} for r, a, b in zip(values, first, last, strict=True)}


def segments(con: duckdb.DuckDBPyConnection, t0: int | None = None, t1: int | None = None,
             ranks: Sequence[int] | None = None) -> pd.DataFrame:
    """The segments of every rank (or of ``ranks``): int64 columns rank, start, end, level;
    only those overlapping [t0, t1] when given (the timeline of a few steps of a long run).

    The levels are worked out in SQL, so a trace's tens of millions of intervals reach Python
    as four integer columns, not as region names.
    """
    where = ""
    if ranks is not None:
        listed = sorted({int(r) for r in ranks})
        if not listed:
            where = "AND false"
        elif listed[-1] - listed[0] + 1 == len(listed):  # consecutive ranks: a range DuckDB prunes files by
            where = f"AND {{rank}} BETWEEN {listed[0]} AND {listed[-1]}"  # (an IN list of 1,024: 1.2 s a query)
        else:
            where = "AND {rank} IN (" + ", ".join(str(r) for r in listed) + ")"
    whole = t0 is None and t1 is None  # no window: no time filter for DuckDB to evaluate
    window = {} if whole else {"lo": -(1 << 62) if t0 is None else int(t0),
                               "hi": (1 << 62) if t1 is None else int(t1)}

    def during(enter: str, leave: str) -> str:  # overlaps the window
        return "true" if whole else f"{leave} >= $lo AND {enter} <= $hi"

    # One statement, the collectives read once for all that needs them (at 4,096 ranks each
    # read of a table opens 4,096 files: four statements took 3.8 s, this one 2.1). Each
    # region's level is found once (the regions are few), so the intervals join on integers.
    got = con.execute(f"""
        WITH levels AS ({LEVELS}),
        c AS MATERIALIZED (
            SELECT rank, location_id, interval_idx, is_async, op, enter_ns, leave_ns, wait_ns FROM collectives
            WHERE {during('enter_ns', 'leave_ns')} {where.format(rank="rank")}
        ),
        -- only the main threads' collectives can match a main thread's interval (is_async is
        -- exactly "not on a main thread"): most collectives run on communication lanes
        ops AS (SELECT location_id, interval_idx, any_value(op) = 'allreduce' AS allreduce FROM c
                WHERE NOT is_async GROUP BY location_id, interval_idx),
        -- collectives on accelerator streams are the device's view (device_phases), not the host's
        host AS (SELECT * FROM c WHERE location_id NOT IN
                 (SELECT location_id FROM locations WHERE kind = 'accelerator_stream'))
        SELECT i.rank, i.start_ns AS start, i.end_ns AS "end",
               CASE WHEN v.by_op AND o.allreduce THEN {SYNC_ALLREDUCE}
                    WHEN v.by_op AND NOT o.allreduce THEN {SYNC_OTHER}
                    ELSE v.level END AS level
        FROM intervals i JOIN levels v USING (region_id) JOIN locations l USING (location_id)
        LEFT JOIN ops o ON o.location_id = i.location_id AND o.interval_idx = i.idx
        WHERE l.is_main AND {during('i.start_ns', 'i.end_ns')} {where.format(rank="i.rank")}
        UNION ALL
        -- a collective's waiting (asynchronous ones on lanes or other threads at their own levels)
        SELECT rank, enter_ns, enter_ns + wait_ns, CASE WHEN is_async THEN {ASYNC_IDLE} ELSE {SYNC_IDLE} END
        FROM host
        UNION ALL
        -- asynchronous collectives themselves (synchronous ones are covered by their regions)
        SELECT rank, enter_ns, leave_ns, CASE WHEN op = 'allreduce' THEN {ASYNC_ALLREDUCE} ELSE {ASYNC_OTHER} END
        FROM host WHERE is_async
        UNION ALL
        {_receive_waits_sql(where.format(rank="p.rank"), during("p.enter_ns", "p.leave_ns"))}
    """, window).fetchnumpy()
    return pd.DataFrame({name: np.asarray(got[name], dtype=np.int64) for name in ("rank", "start", "end", "level")})


def receive_waits(con: duckdb.DuckDBPyConnection, where: str = "", during: str = "true",
                  window: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """The segments of receives waiting for a late sender on main threads (view p2p as p,
    ``where``: more conditions, ``during``: the window's)."""
    return con.execute(_receive_waits_sql(where, during), dict(window or {})).fetchnumpy()


def _receive_waits_sql(where: str, during: str) -> str:
    return f"""
        SELECT p.rank, p.enter_ns, p.enter_ns + p.wait_ns, {SYNC_IDLE}
        FROM p2p p JOIN locations l USING (location_id)
        WHERE l.is_main AND p.wait_ns > 0 AND {during} {where}
    """


def _listed(*categories: str) -> str:
    return "(" + ", ".join(f"'{c}'" for c in categories) + ")"


# Each region of SEGMENT_CATEGORIES with its level (over view regions); by_op: a collective's
# operation decides (a record's, or a name pattern's), else (and for regions without either)
# the level by name.
LEVELS = f"""
    SELECT region_id, r.category = '{Category.COLLECTIVE}' AS by_op,
           CASE
             WHEN r.category = '{Category.COLLECTIVE}'
                  AND coalesce(r.pattern_op = 'allreduce', lower(replace(r.name, '_', '')) LIKE '%allreduce%')
               THEN {SYNC_ALLREDUCE}
             WHEN r.category IN {_listed(Category.COLLECTIVE, Category.P2P)} THEN {SYNC_OTHER}
             WHEN r.category IN {_listed(Category.OVERHEAD, Category.RUNTIME)} THEN {OTHER}
             WHEN r.category = '{Category.WAIT}' AND r.rule = '{Rule.PATTERN}' THEN
               CASE WHEN r.pattern_op = 'allreduce' THEN {NAMED_WAIT_ALLREDUCE} ELSE {NAMED_WAIT_OTHER} END
             WHEN r.category = '{Category.WAIT}' THEN {WAIT}
             ELSE {COMPUTE}
           END AS level
    FROM regions r WHERE r.category IN {_listed(*SEGMENT_CATEGORIES)}
"""


def segments_of(intervals: Mapping[str, np.ndarray], levels: Mapping[str, np.ndarray],
                coll: Mapping[str, np.ndarray], p2p: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """:func:`segments` of some ranks from arrays: the main threads' ``intervals``
    (rank, location_id, idx, region_id, start_ns, end_ns), ``levels`` (:data:`LEVELS`'
    columns), the ranks' collectives ``coll`` (rank, location_id, interval_idx, is_async,
    enter_ns, leave_ns, wait_ns, allreduce: 1 if the op is, 0 if not, -1 if it is NULL,
    on_device: on an accelerator stream) and the receives' waits ``p2p``
    (:func:`receive_waits`). The build's phase stage uses it on what it holds in memory;
    every segment is one of :func:`segments`."""
    at = index_of(levels["region_id"], intervals["region_id"])
    kept = np.flatnonzero(at >= 0)  # the intervals of regions with a level
    at = at[kept]
    level = np.asarray(levels["level"], np.int64)[at]
    by_op = np.flatnonzero(np.asarray(levels["by_op"], bool)[at])  # of those, the collectives' regions
    sync = ~np.asarray(coll["is_async"], bool)
    op = np.asarray(coll["allreduce"], np.int8)
    if len(by_op):
        # the operation of the interval performing a main thread's collective: any of them,
        # but not NULL if one is not (as DuckDB's any_value); looked up only for the intervals
        # of collective regions, a seventh of them in our traces
        keys_loc, keys_idx, keys_op = coll["location_id"][sync], coll["interval_idx"][sync], op[sync]
        first = _first_of_pairs(keys_loc, keys_idx, keys_op < 0)
        rows = kept[by_op]
        found = position(keys_loc[first], keys_idx[first], intervals["location_id"][rows], intervals["idx"][rows])
        of = np.where(found >= 0, keys_op[first][found.clip(0)] if len(first) else -1, -1)
        level[by_op] = np.where(of == 1, SYNC_ALLREDUCE, np.where(of == 0, SYNC_OTHER, level[by_op]))
    host = ~np.asarray(coll["on_device"], bool)
    rank, enter = np.asarray(coll["rank"], np.int64), np.asarray(coll["enter_ns"], np.int64)
    late = host & ~sync
    parts = [
        (intervals["rank"][kept], intervals["start_ns"][kept], intervals["end_ns"][kept], level),
        # a collective's waiting (asynchronous ones on lanes or other threads at their own levels)
        (rank[host], enter[host], enter[host] + np.asarray(coll["wait_ns"], np.int64)[host],
         np.where(sync[host], SYNC_IDLE, ASYNC_IDLE)),
        # asynchronous collectives themselves
        (rank[late], enter[late], np.asarray(coll["leave_ns"], np.int64)[late],
         np.where(op[late] == 1, ASYNC_ALLREDUCE, ASYNC_OTHER)),
        tuple(p2p.values()),
    ]
    # one block of columns, as pandas keeps it: a frame of separate arrays would be copied into one
    columns = ("rank", "start", "end", "level")
    out = np.empty((len(columns), sum(len(part[0]) for part in parts)), np.int64)
    for i in range(len(columns)):
        np.concatenate([np.asarray(part[i], np.int64) for part in parts], out=out[i])
    return pd.DataFrame(out.T, columns=list(columns), copy=False)


def _first_of_pairs(a: np.ndarray, b: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The index of the first row of each distinct (a, b), rows where ``last`` is true after
    the others."""
    if not len(a):
        return np.zeros(0, np.int64)
    order = np.lexsort((np.arange(len(a)), last, b, a))
    sa, sb = a[order], b[order]
    new = np.r_[True, (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])]
    return order[new]


WINDOW_SEGMENTS = 2_000_000  # segments swept at a time: bounds memory whatever the trace size

# (rank, step numbers, ns per phase: steps x len(PHASES)) for each swept window
Emit = Callable[[int, np.ndarray, np.ndarray], None]


def build_phases(con: duckdb.DuckDBPyConnection, emit: Emit,
                 segments_of_ranks: Callable[[list[int]], pd.DataFrame] | None = None,
                 counts: Mapping[int, int] | None = None, steps: Mapping[str, np.ndarray] | None = None) -> None:
    """Sweep the phases of every rank with steps (views intervals, steps, collectives, p2p,
    regions, locations), handing each window's totals to ``emit``.

    Ranks are swept together while their main threads hold about :data:`WINDOW_SEGMENTS`
    intervals in all (thousands of small ranks: a few queries, not thousands); a rank with
    more is swept alone, in windows of whole steps of about that many, so memory stays
    bounded for long traces. ``segments_of_ranks`` gives the segments of a batch of ranks
    where a caller can do it faster than :func:`segments` (which does the windows),
    ``counts`` each rank's main-thread intervals where the caller has counted them, and
    ``steps`` the rows of view steps (rank, step, start_ns, end_ns) where it holds them.
    """
    fetch = segments_of_ranks or (lambda ranks: segments(con, ranks=ranks))
    if counts is None:
        counts = dict(con.execute("""
            SELECT i.rank, count(*) FROM intervals i JOIN locations l USING (location_id)
            WHERE l.is_main GROUP BY i.rank""").fetchall())
    if steps is None:
        ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM steps ORDER BY rank").fetchall()]
    else:
        ranks = np.unique(steps["rank"]).tolist()
    steps_of = functools.partial(_steps_of, con, steps)
    batch: list[int] = []
    held = 0
    for rank in ranks:
        n = counts.get(rank, 0)
        if batch and held + n > WINDOW_SEGMENTS:
            _sweep_ranks(steps_of(batch), batch, emit, fetch)
            batch, held = [], 0
        if n > WINDOW_SEGMENTS:
            _sweep_rank_in_windows(con, steps_of([rank]), rank, n, emit)
        else:
            batch.append(rank)
            held += n
    if batch:
        _sweep_ranks(steps_of(batch), batch, emit, fetch)


def _steps_of(con: duckdb.DuckDBPyConnection, steps: Mapping[str, np.ndarray] | None,
              ranks: list[int]) -> dict[str, np.ndarray]:
    """The steps of ``ranks`` (from ``steps`` when given, else view steps) by rank, start, step."""
    if steps is None:
        listed = ", ".join(str(int(r)) for r in ranks)
        st = con.execute(f"SELECT rank, step, start_ns, end_ns FROM steps WHERE rank IN ({listed}) "
                         "ORDER BY rank, start_ns, step").fetchnumpy()
    else:
        mine = np.isin(steps["rank"], ranks)
        st = {c: np.asarray(steps[c])[mine] for c in ("rank", "step", "start_ns", "end_ns")}
        order = np.lexsort((st["step"], st["start_ns"], st["rank"]))
        st = {c: v[order] for c, v in st.items()}
    return {"rank": np.asarray(st["rank"], np.int64), "step": np.asarray(st["step"], np.int32),
            "start": np.asarray(st["start_ns"], np.int64), "end": np.asarray(st["end_ns"], np.int64)}


def _sweep_ranks(st: dict[str, np.ndarray], ranks: list[int], emit: Emit,
                 fetch: Callable[[list[int]], pd.DataFrame]) -> None:
    seg = fetch(ranks)
    if len(ranks) > 1:
        seg = seg.sort_values("rank", kind="stable")
    seg_rank = seg["rank"].to_numpy()
    for rank in ranks:
        a, b = np.searchsorted(st["rank"], [rank, rank + 1])
        c, d = np.searchsorted(seg_rank, [rank, rank + 1])
        mine = seg.iloc[c:d]
        totals = sweep(mine["start"].to_numpy(), mine["end"].to_numpy(), mine["level"].to_numpy(),
                       st["start"][a:b], st["end"][a:b])
        emit(rank, st["step"][a:b], totals)


def _sweep_rank_in_windows(con: duckdb.DuckDBPyConnection, st: dict[str, np.ndarray], rank: int, count: int,
                           emit: Emit) -> None:
    step_ids, starts, ends = st["step"], st["start"], st["end"]
    per_window = max(1, len(starts) * WINDOW_SEGMENTS // max(1, count))
    for a in range(0, len(starts), per_window):
        b = min(len(starts), a + per_window)
        # segments overlapping the window; the sweep counts only what lies inside its steps
        seg = segments(con, int(starts[a:b].min()), int(ends[a:b].max()), ranks=[rank])
        totals = sweep(seg["start"].to_numpy(), seg["end"].to_numpy(), seg["level"].to_numpy(),
                       starts[a:b], ends[a:b])
        emit(rank, step_ids[a:b], totals)


def phase_rows(rank: int, steps: np.ndarray, totals: np.ndarray) -> dict[str, np.ndarray]:
    """The ``phases`` rows of one window: columns rank, step, phase (codes into
    :data:`PHASE_NAMES`), duration_ns."""
    n = len(steps)
    return {
        "rank": np.full(n * len(PHASES), rank, dtype=np.int32),
        "step": np.tile(np.asarray(steps, dtype=np.int32), len(PHASES)),
        "phase": np.repeat(np.arange(len(PHASES), dtype=np.int32), n),
        "duration_ns": totals.T.reshape(-1),
    }


def summary(con: duckdb.DuckDBPyConnection, per: int = 1) -> pd.DataFrame:
    """Per rank: steps, mean step time, and each phase as a percentage of step time.

    With ``per`` > 1, per group of ``per`` consecutive rank numbers (rank // per): ``ranks``
    (first-last), steps per rank, the mean step and each phase's share of the group's time."""
    key, first, steps = rank_group_sql(per)
    ns = ", ".join(f"sum(duration_ns) FILTER (WHERE phase = '{p}') AS \"{p}\"" for p in PHASE_NAMES)
    pct = ", ".join(f"round(100.0 * p.\"{p}\" / nullif(s.total, 0), 1) AS \"{p}%\"" for p in PHASE_NAMES)
    return con.execute(f"""
        WITH s AS (SELECT {key} AS g, {first}, {steps}, avg(duration_ns) / 1e6 AS step_ms,
                          sum(duration_ns) AS total FROM steps GROUP BY ALL),
             p AS (SELECT {key} AS g, {ns} FROM phases GROUP BY ALL)
        SELECT s.* EXCLUDE (g, step_ms, total), round(s.step_ms, 3) AS step_ms, {pct}
        FROM s LEFT JOIN p USING (g) ORDER BY s.g
    """).df()
