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

import numpy as np
import pandas as pd

from analyze.tables.causes.window import Window

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
    steps in a window; ``waits``: :func:`.delays.idle_waits`."""
    ends: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)
    for rank, rw in win.ranks.items():
        for s, a, b in zip(rw.steps.tolist(), rw.step_start.tolist(), rw.step_end.tolist(), strict=True):
            ends[s][rank] = (a, b)
    per_step: dict[int, list] = defaultdict(list)
    known = waits[waits["cause_rank"].notna()] if len(waits) else waits
    for row in known.itertuples(index=False):
        per_step[int(row.step)].append((int(row.rank), int(row.idle_start_ns), int(row.idle_end_ns),
                                        int(row.cause_rank), int(row.cause_enter_ns), str(row.op)))
    hops, summary = [], []
    for step in sorted(ends):
        path = walk(ends[step], per_step.get(step, []))
        last = path[0]
        summary.append((step, path[-1][1], last[2], last[0]))
        for rank, a, b, via in reversed(path):
            if b > a or len(path) == 1:
                hops.append((step, 0, rank, a, b, b - a, via))
    chain = pd.DataFrame(hops, columns=PATH_COLUMNS)
    chain["hop"] = chain.groupby("step").cumcount()
    return chain, pd.DataFrame(summary, columns=["step", "start_ns", "end_ns", "end_rank"])


def path_regions(chain: pd.DataFrame, times: pd.DataFrame) -> pd.DataFrame:
    """critical_path_regions rows (step, rank, region_id, duration_ns) from the chain's
    stretches and :func:`.region_time.region_times` of them (q: row of ``chain``)."""
    q = times["q"].to_numpy(np.int64)
    t = pd.DataFrame({"step": chain["step"].to_numpy()[q], "rank": chain["rank"].to_numpy()[q],
                      "region_id": times["region"].to_numpy(), "duration_ns": times["ns"].to_numpy()})
    return t.groupby(["step", "rank", "region_id"], as_index=False)["duration_ns"].sum()


def step_balance(ends: pd.DataFrame, chain: pd.DataFrame, regions: pd.DataFrame,
                 per_step: pd.DataFrame) -> pd.DataFrame:
    """The ``step_balance`` rows of a window's steps (``critical_region`` as the region_id of
    the region with the most time on the path). ``per_step``: the ranks' step summaries
    (:func:`.balance.step_summary`): balanced = mean over ranks of duration - idle."""
    busy = per_step.assign(busy=per_step["duration_ns"] - per_step["idle_ns"]).groupby("step")
    b = pd.DataFrame({"ranks": busy.size(), "slowest_rank_ns": busy["duration_ns"].max(),
                      "balanced_ns": busy["busy"].mean().round().astype(np.int64)}).reset_index()
    on_path = chain.groupby(["step", "rank"], as_index=False)["duration_ns"].sum()
    ranks = on_path.sort_values(["step", "duration_ns", "rank"], ascending=[True, False, True]).groupby("step")
    top_rank = ranks.first()["rank"].rename("critical_rank")
    path_ranks = on_path[on_path["duration_ns"] > 0].groupby("step").size().rename("path_ranks")
    by_region = regions.groupby(["step", "region_id"], as_index=False)["duration_ns"].sum()
    top_region = (by_region.sort_values(["step", "duration_ns"], ascending=[True, False]).groupby("step")
                  .first()["region_id"])
    out = ends.merge(b, on="step").join(path_ranks, on="step").join(top_rank, on="step")
    out["region_id"] = out["step"].map(top_region)
    out["duration_ns"] = out["end_ns"] - out["start_ns"]
    out["imbalance_ns"] = out["duration_ns"] - out["balanced_ns"]
    out["path_ranks"] = out["path_ranks"].fillna(0).astype(np.int64)
    return out
