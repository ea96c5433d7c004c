"""One pass over a run's steps, a few at a time, with what the cause analyses need.

A :class:`Window` covers steps ``a..b-1`` of every rank. For each rank it holds:

- the phase model's elementary intervals and their phase (the same sweep as
  :func:`analyze.tables.phases.build_phases`, so idle, hidden and exposed time here are the
  phase table's, to the nanosecond);
- the leave times of its blocking communication (synchronous collectives, messages, waits),
  which start a synchronization interval;
- the collectives, messages and waits that overlap the window.

Only the main-thread regions that matter here reach Python (communication, waits, data
loading, forward, backward); time per region between two instants is summed in SQL
(:mod:`.region_time`). Windows cover about :data:`WINDOW_INTERVALS` main-thread intervals, so
memory stays bounded whatever the trace length.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import Category, Rule
from analyze.tables import phases
from analyze.tables.phases import split_by_rank

WINDOW_INTERVALS = 2_000_000  # main-thread intervals per window (as phases.WINDOW_SEGMENTS)
PER_SAMPLE = (Category.DATALOADER, Category.FORWARD, Category.BACKWARD)
IDLE = phases.PHASES.index(phases.Phase.IDLE)
COMPUTE = phases.PHASES.index(phases.Phase.COMPUTE)


def step_index(left: np.ndarray, step_start: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """Index into the (sorted, disjoint) steps of each time in ``left``; -1 outside every step."""
    pos = np.searchsorted(step_start, left, side="right") - 1
    inside = (pos >= 0) & (left < step_end[np.clip(pos, 0, None)])
    return np.where(inside, pos, -1)


@dataclass
class RankWindow:
    rank: int
    steps: np.ndarray  # step numbers, in time order
    step_start: np.ndarray
    step_end: np.ndarray
    bounds: np.ndarray  # elementary interval boundaries of the phase sweep
    codes: np.ndarray  # phase code (index into phases.PHASES) of [bounds[i], bounds[i+1])
    step_of: np.ndarray  # index into ``steps`` of each elementary interval, -1 outside
    blocking_leave: np.ndarray  # sorted leave times of blocking communication regions
    per_sample: np.ndarray  # elementary intervals inside data loading, forward or backward


@dataclass
class Window:
    t0: int
    t1: int
    ranks: dict[int, RankWindow]
    comm: pd.DataFrame  # rank, start, end, kind: communication intervals on every location
    collectives: pd.DataFrame  # rows of the collectives table overlapping the window
    p2p_waits: pd.DataFrame  # receives on main threads that waited for a late sender


class StepIndex:
    """Every rank's steps (start, end, number), for finding the step around a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.all = all_steps(con)
        self.by_rank = {r: (g["step"], g["start_ns"], g["end_ns"]) for r, g in split_by_rank(self.all).items()}
        self.last_step = int(self.all["step"].max()) if len(self.all["step"]) else -1

    def step_at(self, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Step number around each (rank, time); -1 outside every step."""
        out = np.full(len(t), -1, np.int64)
        for r in np.unique(rank):
            if int(r) not in self.by_rank:
                continue
            steps, start, end = self.by_rank[int(r)]
            mine = rank == r
            i = step_index(t[mine], start, end)
            out[mine] = np.where(i >= 0, steps[np.clip(i, 0, None)], -1)
        return out

    def start_before(self, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Start of the latest step of ``rank`` starting at or before ``t``; ``t`` if none."""
        out = np.asarray(t, np.int64).copy()
        for r in np.unique(rank):
            if int(r) not in self.by_rank:
                continue
            _, start, _ = self.by_rank[int(r)]
            mine = rank == r
            pos = np.searchsorted(start, out[mine], side="right") - 1
            out[mine] = np.where(pos >= 0, start[np.clip(pos, 0, None)], out[mine])
        return out


def sync_start(rank_window: RankWindow | None, steps: StepIndex, rank: int, t: np.ndarray) -> np.ndarray:
    """Where each rank's synchronization interval ending at ``t`` begins: the later of the
    start of the step around ``t`` and the last leave of a blocking communication region
    (a synchronous collective, a message, a wait) at or before ``t``."""
    t = np.asarray(t, np.int64)
    b = steps.start_before(np.full(len(t), rank), t)
    if rank_window is not None and len(rank_window.blocking_leave):
        leaves = rank_window.blocking_leave
        pos = np.searchsorted(leaves, t, side="right") - 1
        b = np.where(pos >= 0, np.maximum(b, leaves[np.clip(pos, 0, None)]), b)
    return np.minimum(b, t)


# Main-thread interval kinds, worked out in SQL so that only integers reach Python. A
# collective region without a collective record is named as the phase model names it; a wait
# recognized by a name pattern (oneCCL's event::wait, LBANN's wait) is communication there
# (allreduce or other_comm by regions.pattern_op), a wait known otherwise is not.
OTHER_KIND, COLLECTIVE_KIND, ALLREDUCE_NAMED_KIND, P2P_KIND, WAIT_KIND, PER_SAMPLE_KIND = range(6)
NAMED_WAIT_ALLREDUCE_KIND, NAMED_WAIT_OTHER_KIND = 6, 7
BLOCKING_KINDS = (COLLECTIVE_KIND, ALLREDUCE_NAMED_KIND, P2P_KIND, WAIT_KIND, NAMED_WAIT_ALLREDUCE_KIND,
                  NAMED_WAIT_OTHER_KIND)


def _main_intervals(con: duckdb.DuckDBPyConnection, t0: int, t1: int) -> dict[str, np.ndarray]:
    def listed(cats: tuple[Category, ...]) -> str:
        return "(" + ", ".join(f"'{c}'" for c in cats) + ")"

    got = con.execute(f"""
        WITH kinds AS (
            SELECT region_id,
                   CASE WHEN category = '{Category.COLLECTIVE}' AND coalesce(
                               pattern_op = 'allreduce', lower(replace(name, '_', '')) LIKE '%allreduce%')
                          THEN {ALLREDUCE_NAMED_KIND}
                        WHEN category = '{Category.COLLECTIVE}' THEN {COLLECTIVE_KIND}
                        WHEN category = '{Category.P2P}' THEN {P2P_KIND}
                        WHEN category = '{Category.WAIT}' AND rule = '{Rule.PATTERN}' THEN
                          CASE WHEN pattern_op = 'allreduce' THEN {NAMED_WAIT_ALLREDUCE_KIND}
                               ELSE {NAMED_WAIT_OTHER_KIND} END
                        WHEN category = '{Category.WAIT}' THEN {WAIT_KIND}
                        WHEN category IN {listed(PER_SAMPLE)} THEN {PER_SAMPLE_KIND}
                        ELSE {OTHER_KIND} END AS kind,
                   -- a call that only starts its operation (a non-blocking start, an enqueue on
                   -- a GPU stream) synchronizes nothing
                   coalesce(NOT pattern_blocking, false) AS starts
            FROM regions
        )
        SELECT i.rank, i.idx, i.start_ns, i.end_ns, k.kind, k.starts::BIGINT AS starts
        FROM intervals i JOIN kinds k USING (region_id)
        WHERE i.location_id IN (SELECT location_id FROM locations WHERE is_main)
          AND k.kind <> {OTHER_KIND} AND i.end_ns >= $lo AND i.start_ns <= $hi
    """, {"lo": t0, "hi": t1}).fetchnumpy()
    return {k: np.asarray(v, np.int64) for k, v in got.items()}


def _collectives(con: duckdb.DuckDBPyConnection, t0: int, t1: int) -> pd.DataFrame:
    """The host's collectives (not those on accelerator streams) overlapping [t0, t1]; for
    those that waited, ``cause_rank``: the member whose arrival ended the wait (the lowest
    rank if several arrived at once, on any location).

    The collectives are read once (at thousands of ranks each read opens a file per rank: 0.8 s
    at 4,096). A member that arrived last at ``last_arrival_ns`` in [t0, t1] overlaps the window
    itself, so the window's rows name it; waits whose last arrival lies outside (a collective
    across the window's edge) look for it in a second query of their own."""
    rows = con.execute("""
        WITH a AS MATERIALIZED (SELECT * FROM collectives WHERE leave_ns >= $lo AND enter_ns <= $hi),
        -- kernels on accelerator streams are the device's view (device_phases), as in the phase
        -- model's sweep: the host's tables leave them out (but a kernel may be the last arrival)
        w AS (SELECT * FROM a WHERE location_id NOT IN
                  (SELECT location_id FROM locations WHERE kind = 'accelerator_stream')),
        cause AS (
            SELECT w.rank, w.comm_id, w.seq, min(c.rank) AS cause_rank
            FROM w JOIN a c ON c.comm_id = w.comm_id AND c.seq = w.seq
                   AND c.enter_ns = w.last_arrival_ns AND c.rank <> w.rank
            WHERE w.wait_ns > 0 AND w.last_arrival_ns BETWEEN $lo AND $hi GROUP BY ALL
        )
        SELECT w.rank, w.location_id, w.is_async, w.interval_idx, w.comm_id, w.seq, w.op,
               w.enter_ns, w.leave_ns, w.wait_ns, w.last_arrival_ns, cause.cause_rank
        FROM w LEFT JOIN cause USING (rank, comm_id, seq)
    """, {"lo": t0, "hi": t1}).df()
    last = rows["last_arrival_ns"].to_numpy(np.int64, na_value=t0)
    outside = (rows["wait_ns"].to_numpy(np.int64, na_value=0) > 0) & ((last < t0) | (last > t1))
    if outside.any():
        con.register("edge_waits", rows.loc[outside, ["rank", "comm_id", "seq", "last_arrival_ns"]])
        try:
            found = con.execute("""
                SELECT k.rank, k.comm_id, k.seq, min(c.rank) AS cause_rank
                FROM edge_waits k JOIN collectives c ON c.comm_id = k.comm_id AND c.seq = k.seq
                     AND c.enter_ns = k.last_arrival_ns AND c.rank <> k.rank
                GROUP BY ALL
            """).df()
        finally:
            con.unregister("edge_waits")
        at = rows.loc[outside, ["rank", "comm_id", "seq"]].merge(found, how="left", on=["rank", "comm_id", "seq"])
        rows.loc[outside, "cause_rank"] = at["cause_rank"].to_numpy()
    return rows


def _p2p_waits(con: duckdb.DuckDBPyConnection, t0: int, t1: int) -> pd.DataFrame:
    return con.execute("""
        SELECT p.rank, p.peer, p.comm_id, p.tag, p.seq, p.enter_ns, p.leave_ns, p.wait_ns,
               p.partner_enter_ns
        FROM p2p p JOIN locations l USING (location_id)
        WHERE l.is_main AND p.direction = 'recv' AND p.wait_ns > 0
          AND p.leave_ns >= $lo AND p.enter_ns <= $hi
    """, {"lo": t0, "hi": t1}).df()


def _comm(main: dict[str, np.ndarray], colls: pd.DataFrame) -> pd.DataFrame:
    """Communication intervals with their kind (the collective's op, or p2p): every
    collective (synchronous or on a lane) and the main thread's communication regions that
    carry no collective record (messages, MPI_Wait, a Score-P user region named allreduce, a wait
    recognized by its name)."""
    comm_region = np.isin(main["kind"], (COLLECTIVE_KIND, ALLREDUCE_NAMED_KIND, P2P_KIND, NAMED_WAIT_ALLREDUCE_KIND,
                                         NAMED_WAIT_OTHER_KIND))
    sync = colls[~colls["is_async"].astype(bool)]
    # a main thread is one location per rank, so (rank, instance number) names an instance
    rank, idx = main["rank"][comm_region], main["idx"][comm_region]
    recorded = sync["rank"].to_numpy(np.int64) << 40 | sync["interval_idx"].to_numpy(np.int64)
    bare = ~np.isin(rank << 40 | idx, recorded)
    kind = main["kind"][comm_region][bare]
    return pd.concat([
        pd.DataFrame({"rank": colls["rank"].to_numpy(np.int64), "start": colls["enter_ns"].to_numpy(np.int64),
                      "end": colls["leave_ns"].to_numpy(np.int64), "kind": colls["op"].fillna("other").to_numpy(object)}),
        pd.DataFrame({"rank": rank[bare], "start": main["start_ns"][comm_region][bare],
                      "end": main["end_ns"][comm_region][bare],
                      "kind": np.select([kind == P2P_KIND, np.isin(kind, (ALLREDUCE_NAMED_KIND,
                                                                           NAMED_WAIT_ALLREDUCE_KIND))],
                                        ["p2p", "allreduce"], "other").astype(object)}),
    ], ignore_index=True)


def coverage(bounds: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many of the intervals cover each elementary interval of ``bounds``."""
    delta = np.zeros(len(bounds) + 1, np.int64)
    np.add.at(delta, np.searchsorted(bounds, start), 1)
    np.add.at(delta, np.searchsorted(bounds, end), -1)
    return np.cumsum(delta)[: max(len(bounds) - 1, 0)]


def all_steps(con: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    """Every rank's steps as int64 columns rank, step, start_ns, end_ns, by rank and time."""
    got = con.execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, start_ns").fetchnumpy()
    return {k: np.asarray(v, np.int64) for k, v in got.items()}


def _rank_window(rank: int, st: dict[str, np.ndarray], segs: dict[str, np.ndarray], m: dict[str, np.ndarray],
                 ) -> RankWindow:
    step_start = st["start_ns"]
    step_end = st["end_ns"]
    bounds, codes, _ = phases.elementary(segs["start"], segs["end"], segs["level"], step_start, step_end)
    blocking = np.sort(m["end_ns"][np.isin(m["kind"], BLOCKING_KINDS) & (m["starts"] == 0)])
    ps = m["kind"] == PER_SAMPLE_KIND
    per_sample = coverage(bounds, m["start_ns"][ps], m["end_ns"][ps]) > 0
    step_of = step_index(bounds[:-1], step_start, step_end) if len(bounds) > 1 else np.zeros(0, np.int64)
    return RankWindow(rank, st["step"], step_start, step_end, bounds, codes, step_of, blocking, per_sample)


def windows(con: duckdb.DuckDBPyConnection, steps: StepIndex) -> Iterator[Window]:
    """The run's steps in windows of whole steps (the same step numbers on every rank)."""
    if steps.last_step < 0:
        return
    (total,), = con.execute("""SELECT count(*) FROM intervals i JOIN locations l USING (location_id)
                               WHERE l.is_main""").fetchall()
    n_steps = steps.last_step + 1
    per = max(1, n_steps * WINDOW_INTERVALS // max(1, int(total)))
    for a in range(0, n_steps, per):
        inside = (steps.all["step"] >= a) & (steps.all["step"] < a + per)
        if not inside.any():
            continue
        st = {k: v[inside] for k, v in steps.all.items()}
        t0, t1 = int(st["start_ns"].min()), int(st["end_ns"].max())
        segs = phases.segments(con, t0, t1)
        main = _main_intervals(con, t0, t1)
        colls = _collectives(con, t0, t1)
        ranks = {}
        by_rank = split_by_rank(main)
        seg_columns = {c: segs[c].to_numpy(np.int64) for c in ("rank", "start", "end", "level")}
        segs_of = split_by_rank(seg_columns)
        for rank, rs in split_by_rank(st).items():
            ranks[rank] = _rank_window(rank, rs, segs_of.get(rank, {k: v[:0] for k, v in seg_columns.items()}),
                                       by_rank.get(rank, {k: v[:0] for k, v in main.items()}))
        yield Window(t0, t1, ranks, _comm(main, colls), colls, _p2p_waits(con, t0, t1))
