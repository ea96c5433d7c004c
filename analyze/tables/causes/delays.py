"""Root causes of waiting: each idle interval attributed to the rank that arrived last and to
the regions of its step that made it late (the ``delays`` table), after Scalasca's delay
analysis (Böhme et al., "Identifying the root causes of wait states in large-scale parallel
applications", ICPP 2010), adapted to collectives on communication lanes.

1. Idle time is the phase model's: the elementary intervals labelled ``idle``. Each belongs
   to one wait (a collective's ``[enter, enter + wait_ns)`` or a receive's late-sender wait)
   covering it: a synchronous one before an asynchronous one, then the one that ends last
   (the wait the rank cannot get past). So the idle attributed here sums to ``phases``'
   idle time exactly, rank by rank and step by step.
2. The wait ended when the *cause rank* arrived: for a collective, the member whose enter is
   the waiter's ``last_arrival_ns``; for a receive, the sender. For a bucket allreduce on a
   communication lane, that is the rank that issued the bucket last.
3. Each of the two ranks' *synchronization interval* runs from the later of its step's start
   and its last blocking communication (a synchronous collective, a message or a wait) to its
   arrival. The cause's arrival minus the waiter's is then the sum of (a) the cause's excess
   time in each region, its exclusive time in the region in its interval minus the
   waiter's, and (b) how much later the cause's interval began (a delay propagated from
   before the interval: ``late_start``).
4. The wait's idle time is split over the positive terms in proportion (whole nanoseconds,
   largest remainders). Idle whose cause is not in the trace is ``unknown``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyze.schema import CauseKind
from analyze.tables.causes.region_time import NO_REGION
from analyze.tables.causes.window import (
    IDLE,
    RankWindow,
    StepIndex,
    Window,
    sync_start,
)
from analyze.tables.phases import split_by_rank

LATE_START = -2  # pseudo region of the excess (b): the cause's interval began later
COLUMNS = ["rank", "step", "op", "is_async", "comm_id", "seq", "wait_enter_ns", "idle_start_ns",
           "idle_end_ns", "cause_rank", "cause_step", "cause_enter_ns", "cause_kind", "region_id",
           "excess_ns", "idle_ns"]


def owners(rw: RankWindow, start: np.ndarray, end: np.ndarray, sync: np.ndarray) -> dict[str, np.ndarray]:
    """Which wait each idle elementary interval of the rank belongs to.

    ``start``/``end``/``sync``: the rank's waits. Returns columns wait (index into them),
    step (index into the window's steps), idle_ns, idle_start_ns, idle_end_ns.
    """
    idle = (rw.codes == IDLE) & (rw.step_of >= 0) if len(rw.bounds) > 1 else np.zeros(0, bool)
    j = np.flatnonzero(idle)
    owner = np.full(len(j), -1, np.int64)
    for kind in (True, False):  # synchronous waits first
        pick = np.flatnonzero(sync == kind)
        todo = owner < 0
        if len(pick) and todo.any():
            owner[todo] = _latest_ending(rw.bounds, start[pick], end[pick], j[todo], pick)
    left, right, step = rw.bounds[j], rw.bounds[j + 1], rw.step_of[j]
    key = (owner + 1) * (len(rw.steps) + 1) + step  # one group per (wait, step)
    order = np.argsort(key, kind="stable")
    _, first = np.unique(key[order], return_index=True)
    left, right, owner, step = left[order], right[order], owner[order], step[order]
    if len(order) == 0:
        first = np.zeros(0, np.int64)
        return {c: first for c in ("wait", "step", "idle_ns", "idle_start_ns", "idle_end_ns")}
    return {"wait": owner[first], "step": step[first],
            "idle_ns": np.add.reduceat(right - left, first),
            "idle_start_ns": np.minimum.reduceat(left, first),
            "idle_end_ns": np.maximum.reduceat(right, first)}


def _latest_ending(bounds: np.ndarray, start: np.ndarray, end: np.ndarray, j: np.ndarray,
                   ids: np.ndarray) -> np.ndarray:
    """For elementary intervals ``j``, the id of the covering wait that ends last; -1 if none.

    Among waits starting at or before an interval, the one with the largest end covers it if
    any does (a running maximum over waits sorted by start), and no covering wait ends later.
    """
    lo = np.searchsorted(bounds, start)
    hi = np.searchsorted(bounds, end)
    order = np.argsort(lo, kind="stable")
    lo, hi, ids = lo[order], hi[order], ids[order]
    best = np.maximum.accumulate(hi)
    arg = np.maximum.accumulate(np.where(hi == best, np.arange(len(hi)), 0))
    k = np.searchsorted(lo, j, side="right") - 1
    ok = (k >= 0) & (best[np.clip(k, 0, None)] > j)
    return np.where(ok, ids[arg[np.clip(k, 0, None)]], -1)


def _waits(win: Window) -> pd.DataFrame:
    """Every wait in the window: rank, start, end, sync, op, is_async, comm_id, seq,
    cause_rank, cause_enter_ns."""
    c = win.collectives[win.collectives["wait_ns"] > 0]
    p = win.p2p_waits
    return pd.concat([
        pd.DataFrame({"rank": c["rank"], "start": c["enter_ns"], "end": c["enter_ns"] + c["wait_ns"],
                      "sync": ~c["is_async"].astype(bool), "op": c["op"], "is_async": c["is_async"],
                      "comm_id": c["comm_id"], "seq": c["seq"], "cause_rank": c["cause_rank"],
                      "cause_enter_ns": c["last_arrival_ns"]}),
        pd.DataFrame({"rank": p["rank"], "start": p["enter_ns"], "end": p["enter_ns"] + p["wait_ns"],
                      "sync": True, "op": "p2p", "is_async": False, "comm_id": p["comm_id"],
                      "seq": p["seq"], "cause_rank": p["peer"], "cause_enter_ns": p["partner_enter_ns"]}),
    ], ignore_index=True)


def idle_waits(win: Window) -> pd.DataFrame:
    """One row per wait and step with idle time: the wait's columns, its step, idle_ns,
    idle_start_ns, idle_end_ns (the first and last instant of its idle time)."""
    waits = _waits(win)
    of_rank = split_by_rank({"rank": waits["rank"].to_numpy(np.int64), "row": np.arange(len(waits)),
                             "start": waits["start"].to_numpy(np.int64), "end": waits["end"].to_numpy(np.int64),
                             "sync": waits["sync"].to_numpy(bool)})
    idle_columns = ("idle_ns", "idle_start_ns", "idle_end_ns")
    rows, steps, idle = [], [], {c: [] for c in idle_columns}  # type: ignore[var-annotated]
    for rank, rw in win.ranks.items():
        if rank not in of_rank:
            continue
        mine = of_rank[rank]
        own = owners(rw, mine["start"], mine["end"], mine["sync"])
        found = own["wait"] >= 0
        rows.append(mine["row"][own["wait"][found]])
        steps.append(rw.steps[own["step"][found]])
        for c in idle_columns:
            idle[c].append(own[c][found])
    if not rows:
        return pd.DataFrame(columns=[*waits.columns, "step", *idle_columns])
    got = waits.iloc[np.concatenate(rows)].reset_index(drop=True)
    got["step"] = np.concatenate(steps).astype(np.int64)
    for c in idle_columns:
        got[c] = np.concatenate(idle[c]).astype(np.int64)
    return got


def split(total: np.ndarray, group: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Split each group's integer ``total`` over its rows in proportion to ``weight``, in
    whole units summing to the total exactly (largest remainders). ``total`` is per row
    (the group's total repeated); weights are positive."""
    df = pd.DataFrame({"g": group, "w": weight.astype(float), "t": total})
    wsum = df.groupby("g")["w"].transform("sum")
    exact = df["t"] * df["w"] / wsum
    base = np.floor(exact).astype(np.int64)
    left = df["t"] - base.groupby(df["g"]).transform("sum")
    frac_rank = (exact - base).groupby(df["g"]).rank(method="first", ascending=False)
    return (base + (frac_rank <= left).astype(np.int64)).to_numpy()


def with_intervals(win: Window, steps: StepIndex, waits: pd.DataFrame) -> pd.DataFrame:
    """The idle waits of a window with both ranks' synchronization intervals: b_w (the
    waiting rank's start; its end is the wait's start) and b_c (the cause rank's; its end
    is cause_enter_ns). They need the window's blocking communication, so they are found
    window by window, and so is the time per region in them (one statement per window)."""
    w = waits.reset_index(drop=True)
    if w.empty:
        return w.assign(b_w=np.zeros(0, np.int64), b_c=np.zeros(0, np.int64))
    w["cause_rank"] = w["cause_rank"].astype("Int64")
    cause = w["cause_rank"].fillna(-1).to_numpy(np.int64)
    w["b_w"] = _starts(win, steps, w["rank"].to_numpy(np.int64), w["start"].to_numpy(np.int64))
    w["b_c"] = _starts(win, steps, cause, w["cause_enter_ns"].fillna(0).to_numpy(np.int64))
    return w


def queries(w: pd.DataFrame, steps: StepIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rank, step, b, e) of the synchronization intervals of the waits ``w``
    (:func:`with_intervals`) with a known cause: the waiters' first, then the causes'."""
    k = w["cause_rank"].notna().to_numpy()
    rank = np.concatenate([w["rank"].to_numpy(np.int64)[k], w["cause_rank"].to_numpy(np.int64, na_value=-1)[k]])
    b = np.concatenate([w["b_w"].to_numpy(np.int64)[k], w["b_c"].to_numpy(np.int64)[k]])
    e = np.concatenate([w["start"].to_numpy(np.int64)[k], w["cause_enter_ns"].to_numpy(np.int64, na_value=0)[k]])
    return rank, steps.step_at(rank, b), b, e  # an interval lies in the step of its start


def attribute(w: pd.DataFrame, times: pd.DataFrame, steps: StepIndex) -> pd.DataFrame:
    """The ``delays`` rows of the idle waits ``w`` (:func:`with_intervals`; see the module
    docstring), with ``region_id`` for the cause region's name and category. ``times``:
    :func:`.region_time.region_times` of :func:`queries` (q numbered as they are)."""
    if w.empty:
        return pd.DataFrame(columns=COLUMNS)
    k = np.flatnonzero(w["cause_rank"].notna().to_numpy())
    m = len(k)
    q = times["q"].to_numpy()
    mine = times[q < m].rename(columns={"ns": "waiter_ns"})
    theirs = times[q >= m].assign(q=q[q >= m] - m).rename(columns={"ns": "cause_ns"})
    ex = mine.merge(theirs, on=["q", "region"], how="outer").fillna(0)
    ex["excess_ns"] = ex["cause_ns"] - ex["waiter_ns"]
    skew = w["b_c"].to_numpy(np.int64)[k] - w["b_w"].to_numpy(np.int64)[k]
    late = pd.DataFrame({"q": np.arange(m), "region": LATE_START, "excess_ns": skew})
    ex = pd.concat([ex[["q", "region", "excess_ns"]], late], ignore_index=True)
    ex = ex[ex["excess_ns"] > 0]
    ex["wait"] = k[ex["q"].to_numpy(np.int64)]
    unexplained = np.setdiff1d(np.arange(len(w)), ex["wait"].to_numpy())
    rows = pd.concat([ex, pd.DataFrame({"wait": unexplained, "region": NO_REGION, "excess_ns": np.nan})],
                     ignore_index=True)
    rows["idle_total"] = w["idle_ns"].to_numpy(np.int64)[rows["wait"].to_numpy(np.int64)]
    rows["idle_ns"] = split(rows["idle_total"].to_numpy(), rows["wait"].to_numpy(),
                            rows["excess_ns"].fillna(1).to_numpy())
    rows = rows[rows["idle_ns"] > 0]
    return _delay_rows(steps, w, rows, unexplained)


def _starts(win: Window, steps: StepIndex, rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    out = t.copy()
    for r in np.unique(rank):
        if r < 0:
            continue
        mine = rank == r
        out[mine] = sync_start(win.ranks.get(int(r)), steps, int(r), t[mine])
    return out


def _delay_rows(steps: StepIndex, w: pd.DataFrame, rows: pd.DataFrame,
                unexplained: np.ndarray) -> pd.DataFrame:
    src = w.iloc[rows["wait"].to_numpy(np.int64)].reset_index(drop=True)
    region = rows["region"].to_numpy(np.int64)
    no_cause = np.isin(rows["wait"].to_numpy(), unexplained)
    kind = np.where(no_cause, str(CauseKind.UNKNOWN),
                    np.where(region == LATE_START, str(CauseKind.LATE_START), str(CauseKind.REGION)))
    is_region = kind == str(CauseKind.REGION)
    cause = src["cause_rank"]
    return pd.DataFrame({
        "rank": src["rank"], "step": src["step"], "op": src["op"], "is_async": src["is_async"].astype(bool),
        "comm_id": src["comm_id"], "seq": src["seq"], "wait_enter_ns": src["start"],
        "idle_start_ns": src["idle_start_ns"], "idle_end_ns": src["idle_end_ns"],
        "cause_rank": cause.where(~no_cause),
        "cause_step": pd.Series(steps.step_at(cause.fillna(-1).to_numpy(np.int64),
                                              src["cause_enter_ns"].fillna(0).to_numpy(np.int64))
                                ).where(lambda s: (s >= 0) & ~no_cause).astype("Int64"),
        "cause_enter_ns": src["cause_enter_ns"].where(~no_cause),
        "cause_kind": kind,
        "region_id": pd.Series(region).where(is_region).astype("Int64"),
        "excess_ns": rows["excess_ns"].to_numpy(),
        "idle_ns": rows["idle_ns"].to_numpy(np.int64),
    })
