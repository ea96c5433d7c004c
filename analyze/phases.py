"""Split each rank's steps into phases: compute, allreduce, other_comm, idle, other.

The model (docs/phase-model.md has the reasoning):

1. On the rank's main thread, a collective or point-to-point region is communication: idle
   while waiting for a late rank (see :mod:`analyze.collectives`), then ``allreduce`` or
   ``other_comm`` by operation.
2. Measurement overhead and runtime setup (buffer flushes, MPI_Init) are ``other``.
3. An asynchronous collective (on a communication lane or another thread) is communication
   only where the main thread waits for it (a wait region) or is in no compute region
   (forward, backward, optimizer, data loading); where the main thread computes meanwhile,
   the communication is hidden and the time is compute.
4. Everything else inside a step is compute.

Implementation: every rule contributes segments at a level; a sweep over the sorted segment
boundaries gives, for each elementary interval, which levels cover it; the first matching
rule names its phase. Step boundaries are boundaries too, so each elementary interval lies
in at most one step and the phases of a step sum to its duration exactly.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analyze.regions import is_allreduce_name
from analyze.schema import COMPUTE_CATEGORIES, Category, Phase

# Levels of the sweep.
SYNC_IDLE, SYNC_ALLREDUCE, SYNC_OTHER, OTHER, WAIT, COMPUTE, ASYNC_IDLE, ASYNC_ALLREDUCE, ASYNC_OTHER = range(9)
N_LEVELS = 9
PHASES = [Phase.COMPUTE, Phase.ALLREDUCE, Phase.OTHER_COMM, Phase.IDLE, Phase.OTHER]
_CODE = {p: i for i, p in enumerate(PHASES)}


def label(cover: np.ndarray) -> np.ndarray:
    """Phase codes (index into :data:`PHASES`) from a (levels x n) boolean cover matrix."""
    hidden = cover[COMPUTE] & ~cover[WAIT]  # async communication overlapped by compute
    conditions = [
        cover[SYNC_IDLE],
        cover[SYNC_ALLREDUCE],
        cover[SYNC_OTHER],
        cover[OTHER],
        cover[ASYNC_IDLE] & ~hidden,
        cover[ASYNC_ALLREDUCE] & ~hidden,
        cover[ASYNC_OTHER] & ~hidden,
    ]
    choices = [_CODE[Phase.IDLE], _CODE[Phase.ALLREDUCE], _CODE[Phase.OTHER_COMM], _CODE[Phase.OTHER],
               _CODE[Phase.IDLE], _CODE[Phase.ALLREDUCE], _CODE[Phase.OTHER_COMM]]
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
    if len(codes) == 0:
        return pd.DataFrame({"start_ns": [], "end_ns": [], "phase": [], "step": []})
    step = _step_of(bounds[:-1], step_start, step_end)
    keep = step >= 0
    left, right, codes, step = bounds[:-1][keep], bounds[1:][keep], codes[keep], step[keep]
    # a new run starts where the phase or the step changes, or where there is a gap
    new = np.ones(len(codes), dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (step[1:] != step[:-1]) | (left[1:] != right[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(codes)) - 1
    return pd.DataFrame({"start_ns": left[starts], "end_ns": right[ends],
                         "phase": [str(PHASES[c]) for c in codes[starts]], "step": step[starts]})


def segments(con: duckdb.DuckDBPyConnection, t0: int | None = None, t1: int | None = None) -> pd.DataFrame:
    """All segments of all ranks: rank, start, end, level; only those overlapping [t0, t1]
    when given (the timeline of a few steps of a long run)."""
    compute = ", ".join(f"'{c}'" for c in COMPUTE_CATEGORIES)
    lo = -(1 << 62) if t0 is None else int(t0)
    hi = (1 << 62) if t1 is None else int(t1)
    main = con.execute(f"""
        SELECT i.rank, i.start_ns, i.end_ns, r.category, r.name,
               (SELECT c.op FROM collectives c WHERE c.location_id = i.location_id
                  AND c.interval_idx = i.idx LIMIT 1) AS op
        FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
        WHERE l.is_main AND r.category IN ('{Category.COLLECTIVE}', '{Category.P2P}',
              '{Category.OVERHEAD}', '{Category.RUNTIME}', '{Category.WAIT}', {compute})
          AND i.end_ns >= {lo} AND i.start_ns <= {hi}
    """).df()
    level = np.full(len(main), COMPUTE, dtype=np.int64)
    cat = main["category"].to_numpy()
    comm = np.isin(cat, [Category.COLLECTIVE, Category.P2P])
    # The collective record's op decides; regions without records go by name.
    op = main["op"]
    by_name = np.array([is_allreduce_name(n) for n in main["name"]], dtype=bool)
    is_ar = np.where(op.isna().to_numpy(), by_name, op.fillna("").to_numpy() == "allreduce")
    allreduce = comm & is_ar & (cat == Category.COLLECTIVE)
    level[allreduce] = SYNC_ALLREDUCE
    level[comm & ~allreduce] = SYNC_OTHER
    level[np.isin(cat, [Category.OVERHEAD, Category.RUNTIME])] = OTHER
    level[cat == Category.WAIT] = WAIT
    parts = [pd.DataFrame({"rank": main["rank"], "start": main["start_ns"], "end": main["end_ns"],
                           "level": level})]

    colls = con.execute(f"""
        SELECT rank, is_async, op, enter_ns, leave_ns, enter_ns + wait_ns AS wait_end FROM collectives
        WHERE leave_ns >= {lo} AND enter_ns <= {hi}
    """).df()
    if len(colls):
        asy = colls["is_async"].to_numpy()
        ar = colls["op"].to_numpy() == "allreduce"
        parts.append(pd.DataFrame({
            "rank": colls["rank"], "start": colls["enter_ns"], "end": colls["wait_end"],
            "level": np.where(asy, ASYNC_IDLE, SYNC_IDLE)}))
        parts.append(pd.DataFrame({  # async only: sync ones are covered by their regions
            "rank": colls["rank"][asy], "start": colls["enter_ns"][asy], "end": colls["leave_ns"][asy],
            "level": np.where(ar[asy], ASYNC_ALLREDUCE, ASYNC_OTHER)}))
    waits = con.execute(f"""
        SELECT p.rank, p.enter_ns, p.enter_ns + p.wait_ns AS wait_end
        FROM p2p p JOIN locations l USING (location_id)
        WHERE l.is_main AND p.wait_ns > 0 AND p.leave_ns >= {lo} AND p.enter_ns <= {hi}
    """).df()
    if len(waits):
        parts.append(pd.DataFrame({"rank": waits["rank"], "start": waits["enter_ns"],
                                   "end": waits["wait_end"], "level": SYNC_IDLE}))
    return pd.concat(parts, ignore_index=True)


def build_phases(con: duckdb.DuckDBPyConnection) -> None:
    steps = con.execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, step").df()
    segs = segments(con)
    rows = []
    seg_by_rank = dict(tuple(segs.groupby("rank"))) if len(segs) else {}
    for rank, st in steps.groupby("rank"):
        s = seg_by_rank.get(rank)
        empty = np.zeros(0, dtype=np.int64)
        totals = sweep(
            empty if s is None else s["start"].to_numpy(np.int64),
            empty if s is None else s["end"].to_numpy(np.int64),
            empty if s is None else s["level"].to_numpy(np.int64),
            st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64),
        )
        step_ids = st["step"].to_numpy()
        for i, phase in enumerate(PHASES):
            rows.append(pd.DataFrame({"rank": rank, "step": step_ids, "phase": str(phase),
                                      "duration_ns": totals[:, i]}))
    if rows:
        con.register("phase_rows", pd.concat(rows, ignore_index=True))
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
