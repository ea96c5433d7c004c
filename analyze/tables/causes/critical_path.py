"""The critical path of each step: the chain of stretches across ranks that sets its duration
(the ``critical_path`` and ``critical_path_regions`` tables).

Walk back from the end of the step on the rank that finished it last. On a rank, going back
in time, the path stays on that rank until it meets the end of an idle interval (the phase
model's idle, attributed to a wait as in :mod:`.delays`); there the rank was waiting for the
cause rank, so the path jumps to the cause rank at the moment it arrived (which is when the
idle ended) and continues there. It stops at the start of the step on the rank it is on.
The stretches therefore contain no idle time that a later arrival explains, touch end to
end, and their durations sum to the path's length, ``end_ns - start_ns``.

Idle that ended before its cause arrived (the main thread went back to computing while the
asynchronous operation still waited) does not end a stretch: the path stays on the rank.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

from analyze.tables.causes.window import Window
from analyze.tables.groups import Groups

PATH_COLUMNS = ["step", "hop", "rank", "start_ns", "end_ns", "duration_ns", "via"]


def walk(ends: dict[int, tuple[int, int]], waits: list[tuple[int, int, int, int, int, str]]
         ) -> list[tuple[int, int, int, str | None]]:
    """The path of one step, latest stretch first: (rank, start, end, via) per stretch.

    ``ends``: rank -> (step start, step end); ``waits``: (rank, idle_start, idle_end,
    cause_rank, cause_enter, op) of the step's idle intervals with a known cause. ``via``
    is the op of the wait through which the path reached the stretch's rank (None for the
    rank that ended the step).
    """
    by_rank: dict[int, list[tuple[int, int, int, int, str]]] = defaultdict(list)
    for rank, i0, i1, cause, enter, op in waits:
        by_rank[rank].append((i1, i0, cause, enter, op))
    for lst in by_rank.values():
        lst.sort()
    rank = max(ends, key=lambda r: (ends[r][1], -r))
    hop_end = search = ends[rank][1]
    via: str | None = None
    path = []
    for _ in range(len(waits) + len(ends) + 1):  # each jump consumes a wait
        start = ends[rank][0]
        lst = by_rank.get(rank, [])
        # the latest idle interval ending at or before ``search`` and after the step start
        i = _last_at_or_before(lst, search)
        if i < 0 or lst[i][0] <= start:
            path.append((rank, min(start, hop_end), hop_end, via))
            return path
        idle_end, idle_start, cause, enter, op = lst[i]
        if enter > idle_end or cause not in ends or cause == rank:
            search = idle_start  # not ended by the cause's arrival: stay on this rank
            continue
        path.append((rank, idle_end, hop_end, via))
        rank, via = cause, op
        hop_end = search = enter
        if enter <= ends[rank][0]:
            path.append((rank, enter, enter, via))
            return path
    path.append((rank, min(ends[rank][0], hop_end), hop_end, via))
    return path


def _last_at_or_before(lst: list[tuple[int, int, int, int, str]], t: int) -> int:
    lo, hi = 0, len(lst)
    while lo < hi:
        mid = (lo + hi) // 2
        if lst[mid][0] <= t:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def window_paths(win: Window, waits: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(critical_path rows, per-step path ends: step, start_ns, end_ns, end_rank) of the
    steps in a window; ``waits``: :func:`.delays.idle_waits`.

    Most steps' paths are one stretch: the rank that ended the step last has no wait ending
    inside its step. Those are found in numpy; :func:`walk` takes the others (at 10^8 events a
    call per step was most of the time spent on paths: 0.34 s per window of 21k steps)."""
    parts = [rw for rw in win.ranks.values() if len(rw.steps)]
    if not parts:
        return chain_of([], [], [], [], []), pd.DataFrame(columns=["step", "start_ns", "end_ns", "end_rank"])
    step = np.concatenate([rw.steps for rw in parts]).astype(np.int64)
    rank = np.concatenate([np.full(len(rw.steps), rw.rank, np.int64) for rw in parts])
    start = np.concatenate([rw.step_start for rw in parts]).astype(np.int64)
    end = np.concatenate([rw.step_end for rw in parts]).astype(np.int64)
    # each step's rows, and first the rank that ended it last (of equal ends, the lowest rank)
    by_step = np.lexsort((rank, -end, step))
    step, rank, start, end = step[by_step], rank[by_step], start[by_step], end[by_step]
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    stop = np.append(first[1:], len(step))
    steps, last_rank, last_start, last_end = step[first], rank[first], start[first], end[first]

    known = waits[waits["cause_rank"].notna()] if len(waits) else waits
    w_step, w_rank, w_end = (known[c].to_numpy(np.int64) for c in ("step", "rank", "idle_end_ns"))
    at = np.minimum(np.searchsorted(steps, w_step), len(steps) - 1)
    # a wait on the step's last rank ending inside its step: the path may leave that rank
    leaves = (steps[at] == w_step) & (w_rank == last_rank[at]) & (w_end <= last_end[at]) & (w_end > last_start[at])
    walked = np.zeros(len(steps), bool)
    walked[at[leaves]] = True

    one = ~walked
    lo = np.minimum(last_start[one], last_end[one])
    rows: tuple[list[np.ndarray], ...] = ([steps[one]], [last_rank[one]], [lo], [last_end[one]],
                                          [np.full(int(one.sum()), None, object)])
    summary = [steps, np.minimum(last_start, last_end), last_end, last_rank]
    if walked.any():
        of_step: dict[int, list] = defaultdict(list)
        wanted = walked[at] & (steps[at] == w_step)
        sub = known[wanted]
        for row in sub.itertuples(index=False):
            of_step[int(row.step)].append((int(row.rank), int(row.idle_start_ns), int(row.idle_end_ns),
                                           int(row.cause_rank), int(row.cause_enter_ns), str(row.op)))
        hops: list[tuple[int, int, int, int, str | None]] = []
        for k in np.flatnonzero(walked).tolist():
            a, b = int(first[k]), int(stop[k])
            ends = {r: (x, y) for r, x, y in zip(rank[a:b].tolist(), start[a:b].tolist(), end[a:b].tolist(),
                                                 strict=True)}
            s = int(steps[k])
            path = walk(ends, of_step.get(s, []))
            summary[1][k], summary[2][k], summary[3][k] = path[-1][1], path[0][2], path[0][0]
            hops += [(s, r, x, y, via) for r, x, y, via in reversed(path) if y > x or len(path) == 1]
        if hops:
            s_, r_, x_, y_, v_ = zip(*hops, strict=True)
            for column, values in zip(rows[:4], (s_, r_, x_, y_), strict=True):
                column.append(np.array(values, np.int64))
            rows[4].append(np.array(v_, object))
    chain = chain_of(*(np.concatenate(c) for c in rows))
    return chain, pd.DataFrame(dict(zip(["step", "start_ns", "end_ns", "end_rank"], summary, strict=True)))


def chain_of(step: Any, rank: Any, start: Any, end: Any, via: Any) -> pd.DataFrame:
    """critical_path rows from their columns, in step order (stable: a step's stretches stay
    in time order), each step's stretches numbered from 0 (hop)."""
    g = Groups(np.asarray(step, np.int64))
    order = g.order
    step = np.asarray(step, np.int64)[order]
    hop = np.arange(len(step)) - np.repeat(g.first, g.size())
    start, end = np.asarray(start, np.int64)[order], np.asarray(end, np.int64)[order]
    return pd.DataFrame({"step": step, "hop": hop.astype(np.int64), "rank": np.asarray(rank, np.int64)[order],
                         "start_ns": start, "end_ns": end, "duration_ns": end - start,
                         "via": np.asarray(via, object)[order]})


def path_regions(chain: pd.DataFrame, times: pd.DataFrame) -> pd.DataFrame:
    """critical_path_regions rows (step, rank, region_id, duration_ns) from the chain's
    stretches and :func:`.region_time.region_times` of them (q: row of ``chain``), in
    (step, rank, region_id) order."""
    q = times["q"].to_numpy(np.int64)
    step, rank = chain["step"].to_numpy(np.int64)[q], chain["rank"].to_numpy(np.int64)[q]
    region = times["region"].to_numpy(np.int64)
    g = Groups(step, rank, region)
    return pd.DataFrame({"step": step[g.rows], "rank": rank[g.rows], "region_id": region[g.rows],
                         "duration_ns": g.sum(times["ns"].to_numpy(np.int64))})


def top_regions(regions: pd.DataFrame) -> pd.Series:
    """Per step (the index), the region with the most time on its path over all ranks; of
    regions with equal time, the lowest id."""
    g = Groups(regions["step"].to_numpy(np.int64), regions["region_id"].to_numpy(np.int64))
    step, region = regions["step"].to_numpy(np.int64)[g.rows], regions["region_id"].to_numpy(np.int64)[g.rows]
    total = g.sum(regions["duration_ns"].to_numpy(np.int64))
    if not len(step):
        return pd.Series(region, index=step, name="region_id")
    steps = Groups(step)  # groups in (step, region) order: each step's rows are consecutive
    most = np.repeat(steps.max(total), steps.size())
    top = np.flatnonzero(total == most)
    top = top[np.unique(step[top], return_index=True)[1]]  # the lowest region of each step's ties
    return pd.Series(region[top], index=step[top], name="region_id")


def who_is_on(chain: pd.DataFrame) -> pd.DataFrame:
    """Per step of a path's stretches (``critical_path`` rows; the index): ``path_ranks``, the
    ranks with time on it, ``critical_rank``, the one with the most (of equal times the lowest),
    and ``critical_ns``, its time."""
    on_path = chain.groupby(["step", "rank"], as_index=False)["duration_ns"].sum()
    top = on_path.sort_values(["step", "duration_ns", "rank"], ascending=[True, False, True]).groupby("step").first()
    ranks = on_path[on_path["duration_ns"] > 0].groupby("step").size()
    return pd.DataFrame({"path_ranks": ranks.reindex(top.index, fill_value=0), "critical_rank": top["rank"],
                         "critical_ns": top["duration_ns"]})


def step_balance(ends: pd.DataFrame, chain: pd.DataFrame, regions: pd.DataFrame,
                 per_step: pd.DataFrame) -> pd.DataFrame:
    """The ``step_balance`` rows of a window's steps (``critical_region`` as the region_id of
    the region with the most time on the path). ``per_step``: the ranks' step summaries
    (:func:`.balance.step_summary`): balanced = mean over ranks of duration - idle."""
    busy = per_step.assign(busy=per_step["duration_ns"] - per_step["idle_ns"]).groupby("step")
    b = pd.DataFrame({"ranks": busy.size(), "slowest_rank_ns": busy["duration_ns"].max(),
                      "balanced_ns": busy["busy"].mean().round().astype(np.int64)}).reset_index()
    top_region = top_regions(regions)
    out = ends.merge(b, on="step").join(who_is_on(chain)[["path_ranks", "critical_rank"]], on="step")
    out["region_id"] = out["step"].map(top_region)
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    out["imbalance_ns"] = out["duration_ns"] - out["balanced_ns"]
    out["path_ranks"] = out["path_ranks"].fillna(0).astype(np.int64)
    return out
