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

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import COMPUTE_CATEGORIES, Category, Phase, Rule

# Levels of the sweep.
SYNC_IDLE, SYNC_ALLREDUCE, SYNC_OTHER, OTHER, WAIT, COMPUTE, ASYNC_IDLE, ASYNC_ALLREDUCE, ASYNC_OTHER = range(9)
NAMED_WAIT_ALLREDUCE, NAMED_WAIT_OTHER = 9, 10  # waits recognized by name (rule 4)
N_LEVELS = 11
PHASES = [Phase.COMPUTE, Phase.ALLREDUCE, Phase.OTHER_COMM, Phase.IDLE, Phase.OTHER]
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


def labelled_bounds(
    seg_start: np.ndarray, seg_end: np.ndarray, seg_level: np.ndarray, extra_bounds: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(bounds, codes): sorted boundaries and the phase code of each [bounds[i], bounds[i+1])."""
    keep = seg_end > seg_start
    seg_start, seg_end, seg_level = seg_start[keep], seg_end[keep], seg_level[keep]
    bounds = np.unique(np.concatenate([seg_start, seg_end, extra_bounds]))
    if len(bounds) < 2:
        return bounds, np.zeros(0, dtype=np.int64)
    cover = np.zeros((N_LEVELS, len(bounds) - 1), dtype=bool)
    for level in range(N_LEVELS):
        mine = seg_level == level
        if not mine.any():
            continue
        delta = np.zeros(len(bounds) + 1, dtype=np.int64)
        np.add.at(delta, np.searchsorted(bounds, seg_start[mine]), 1)
        np.add.at(delta, np.searchsorted(bounds, seg_end[mine]), -1)
        cover[level] = np.cumsum(delta)[: len(bounds) - 1] > 0
    return bounds, label(cover)


def _step_of(left: np.ndarray, step_start: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """Index of the step containing each elementary interval starting at ``left``, or -1."""
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
    out = np.zeros((n_steps, len(PHASES)), dtype=np.int64)
    if n_steps == 0:
        return out
    bounds, codes = labelled_bounds(seg_start, seg_end, seg_level, np.concatenate([step_start, step_end]))
    if len(codes) == 0:
        return out
    step = _step_of(bounds[:-1], step_start, step_end)
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
    bounds, codes = labelled_bounds(seg_start, seg_end, seg_level, np.concatenate([step_start, step_end]))
    step = _step_of(bounds[:-1], step_start, step_end) if len(codes) else np.zeros(0, dtype=np.int64)
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
                         "phase": [str(PHASES[c]) for c in codes[starts]], "step": step[starts]})


def segments(con: duckdb.DuckDBPyConnection, t0: int | None = None, t1: int | None = None,
             rank: int | None = None) -> pd.DataFrame:
    """The segments of every rank (or of ``rank``): int64 columns rank, start, end, level;
    only those overlapping [t0, t1] when given (the timeline of a few steps of a long run).

    The levels are worked out in SQL, so a trace's tens of millions of intervals reach Python
    as four integer columns, not as region names.
    """
    where = f"AND {{rank}} = {int(rank)}" if rank is not None else ""
    window = {"lo": -(1 << 62) if t0 is None else int(t0), "hi": (1 << 62) if t1 is None else int(t1)}
    def listed(*categories: str) -> str:
        return "(" + ", ".join(f"'{c}'" for c in categories) + ")"

    comm = listed(Category.COLLECTIVE, Category.P2P)
    kept = listed(Category.COLLECTIVE, Category.P2P, Category.OVERHEAD, Category.RUNTIME,
                  Category.WAIT, *COMPUTE_CATEGORIES)
    parts = [con.execute(f"""
        WITH ops AS (SELECT location_id, interval_idx, any_value(op) AS op FROM collectives
                     WHERE leave_ns >= $lo AND enter_ns <= $hi {where.format(rank="rank")}
                     GROUP BY location_id, interval_idx)
        SELECT i.rank, i.start_ns, i.end_ns,
               CASE
                 WHEN r.category = '{Category.COLLECTIVE}'
                      -- the collective's op decides (a record's, or a name pattern's);
                      -- regions without either go by name
                      AND coalesce(o.op = 'allreduce', r.pattern_op = 'allreduce',
                                   lower(replace(r.name, '_', '')) LIKE '%allreduce%')
                   THEN {SYNC_ALLREDUCE}
                 WHEN r.category IN {comm} THEN {SYNC_OTHER}
                 WHEN r.category IN {listed(Category.OVERHEAD, Category.RUNTIME)} THEN {OTHER}
                 WHEN r.category = '{Category.WAIT}' AND r.rule = '{Rule.PATTERN}' THEN
                   CASE WHEN r.pattern_op = 'allreduce' THEN {NAMED_WAIT_ALLREDUCE} ELSE {NAMED_WAIT_OTHER} END
                 WHEN r.category = '{Category.WAIT}' THEN {WAIT}
                 ELSE {COMPUTE}
               END
        FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
        LEFT JOIN ops o ON o.location_id = i.location_id AND o.interval_idx = i.idx
        WHERE l.is_main AND r.category IN {kept}
          AND i.end_ns >= $lo AND i.start_ns <= $hi {where.format(rank="i.rank")}
    """, window).fetchnumpy()]
    # a collective's waiting (asynchronous ones on lanes or other threads at their own levels);
    # collectives on accelerator streams are the device's view (device_phases), not the host's
    host = "location_id NOT IN (SELECT location_id FROM locations WHERE kind = 'accelerator_stream')"
    parts.append(con.execute(f"""
        SELECT rank, enter_ns, enter_ns + wait_ns, CASE WHEN is_async THEN {ASYNC_IDLE} ELSE {SYNC_IDLE} END
        FROM collectives WHERE leave_ns >= $lo AND enter_ns <= $hi AND {host} {where.format(rank="rank")}
    """, window).fetchnumpy())
    # asynchronous collectives themselves (synchronous ones are covered by their regions)
    parts.append(con.execute(f"""
        SELECT rank, enter_ns, leave_ns, CASE WHEN op = 'allreduce' THEN {ASYNC_ALLREDUCE} ELSE {ASYNC_OTHER} END
        FROM collectives WHERE is_async AND leave_ns >= $lo AND enter_ns <= $hi AND {host}
              {where.format(rank="rank")}
    """, window).fetchnumpy())
    # a receive waiting for a late sender
    parts.append(con.execute(f"""
        SELECT p.rank, p.enter_ns, p.enter_ns + p.wait_ns, {SYNC_IDLE}
        FROM p2p p JOIN locations l USING (location_id)
        WHERE l.is_main AND p.wait_ns > 0 AND p.leave_ns >= $lo AND p.enter_ns <= $hi
              {where.format(rank="p.rank")}
    """, window).fetchnumpy())
    columns = ("rank", "start", "end", "level")
    return pd.DataFrame({name: np.concatenate([np.asarray(list(part.values())[i], dtype=np.int64)
                                               for part in parts])
                         for i, name in enumerate(columns)})


WINDOW_SEGMENTS = 2_000_000  # segments swept at a time: bounds memory whatever the trace size


def build_phases(con: duckdb.DuckDBPyConnection) -> None:
    """Fill ``phases``: rank by rank and, within a rank, in windows of whole steps holding
    about :data:`WINDOW_SEGMENTS` segments, so memory stays bounded for long traces."""
    counts = dict(con.execute("""
        SELECT i.rank, count(*) FROM intervals i JOIN locations l USING (location_id)
        WHERE l.is_main GROUP BY i.rank""").fetchall())
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM steps ORDER BY rank").fetchall()]
    for rank in ranks:
        st = con.execute("SELECT step, start_ns, end_ns FROM steps WHERE rank = $r ORDER BY start_ns",
                         {"r": rank}).fetchnumpy()
        step_ids = np.asarray(st["step"], np.int32)
        starts, ends = np.asarray(st["start_ns"], np.int64), np.asarray(st["end_ns"], np.int64)
        per_window = max(1, len(starts) * WINDOW_SEGMENTS // max(1, counts.get(rank, 0)))
        for a in range(0, len(starts), per_window):
            b = min(len(starts), a + per_window)
            # segments overlapping the window; the sweep counts only what lies inside its steps
            seg = segments(con, int(starts[a:b].min()), int(ends[a:b].max()), rank=rank)
            totals = sweep(seg["start"].to_numpy(), seg["end"].to_numpy(), seg["level"].to_numpy(),
                           starts[a:b], ends[a:b])
            _insert_phases(con, rank, step_ids[a:b], totals)


def _insert_phases(con: duckdb.DuckDBPyConnection, rank: int, steps: np.ndarray, totals: np.ndarray) -> None:
    n = len(steps)
    rows = {
        "rank": np.full(n * len(PHASES), rank, dtype=np.int32),
        "step": np.tile(steps, len(PHASES)),
        "phase": np.repeat(np.array([str(p) for p in PHASES], dtype=object), n),
        "duration_ns": totals.T.reshape(-1),
    }
    con.register("phase_rows", rows)
    con.execute("INSERT INTO phases SELECT rank, step, phase, duration_ns FROM phase_rows")
    con.unregister("phase_rows")


def summary(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per rank: steps, mean step time, and each phase as a percentage of step time."""
    return con.execute("""
        WITH s AS (SELECT rank, count(*) AS steps, avg(duration_ns) / 1e6 AS step_ms,
                          sum(duration_ns) AS total FROM steps GROUP BY rank),
             p AS (SELECT rank, phase, sum(duration_ns) AS ns FROM phases GROUP BY rank, phase)
        SELECT s.rank, s.steps, round(s.step_ms, 3) AS step_ms,
               round(100.0 * sum(CASE WHEN phase = 'compute' THEN ns END) / nullif(total, 0), 1) AS "compute%",
               round(100.0 * sum(CASE WHEN phase = 'allreduce' THEN ns END) / nullif(total, 0), 1) AS "allreduce%",
               round(100.0 * sum(CASE WHEN phase = 'other_comm' THEN ns END) / nullif(total, 0), 1) AS "other_comm%",
               round(100.0 * sum(CASE WHEN phase = 'idle' THEN ns END) / nullif(total, 0), 1) AS "idle%",
               round(100.0 * sum(CASE WHEN phase = 'other' THEN ns END) / nullif(total, 0), 1) AS "other%"
        FROM s LEFT JOIN p USING (rank)
        GROUP BY s.rank, s.steps, s.step_ms, s.total ORDER BY s.rank
    """).df()
