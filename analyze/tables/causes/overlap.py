"""Communication/computation overlap per rank, step and collective kind (the ``overlap`` table).

On the phase model's elementary intervals (see :mod:`.window`), for each kind of
communication (a collective's op, ``p2p``, and ``all``):

- ``comm_ns``: wall time during which at least one operation of the kind is in flight on
  any of the rank's locations (main thread, communication lanes, other threads);
- ``busy_ns``: the same, counting each concurrent operation (summed over lanes);
- ``hidden_ns``: the part of ``comm_ns`` the phase model counts as compute: an asynchronous
  operation while the main thread computes (forward, backward, optimizer, data loading) and
  does not wait for it;
- ``exposed_ns = comm_ns - hidden_ns``; for ``all`` it equals the step's allreduce,
  other_comm and idle phases, plus communication under measurement overhead (``other``).

A blocking allreduce after backward is never hidden (the main thread is inside it); DDP's
gradient buckets and Horovod's background reductions are hidden while backward still runs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyze.tables.causes.window import COMPUTE, RankWindow, Window, coverage, step_index

ALL = "all"


def rank_overlap(rw: RankWindow, comm: pd.DataFrame) -> pd.DataFrame:
    """Overlap rows (rank, step, kind, calls, comm_ns, busy_ns, hidden_ns, exposed_ns,
    overlap_ratio) of one rank's steps in a window; ``comm``: that rank's intervals."""
    n_steps = len(rw.steps)
    if len(rw.bounds) < 2 or n_steps == 0:
        return _empty()
    length = np.diff(rw.bounds)
    inside = rw.step_of >= 0
    step = rw.step_of[inside]
    computing = rw.codes == COMPUTE

    def per_step(weights: np.ndarray) -> np.ndarray:
        return np.bincount(step, weights=weights[inside], minlength=n_steps).astype(np.int64)

    rows = []
    any_cover = np.zeros(len(length), bool)
    busy_all = np.zeros(n_steps, np.int64)
    calls_all = np.zeros(n_steps, np.int64)
    for kind in sorted(set(comm["kind"])):
        mine = comm[comm["kind"] == kind]
        s, e = mine["start"].to_numpy(np.int64), mine["end"].to_numpy(np.int64)
        count = coverage(rw.bounds, s, e)  # operations of this kind in flight
        at = step_index(s, rw.step_start, rw.step_end)
        calls = np.bincount(at[at >= 0], minlength=n_steps).astype(np.int64)
        busy = per_step(length * count)
        rows.append((kind, count > 0, calls, busy))
        any_cover |= count > 0
        busy_all += busy
        calls_all += calls
    rows.append((ALL, any_cover, calls_all, busy_all))
    out = []
    for kind, covered, calls, busy in rows:
        comm_ns = per_step(length * covered)
        hidden = per_step(length * (covered & computing))
        out.append(pd.DataFrame({
            "rank": rw.rank, "step": rw.steps, "kind": kind, "calls": calls, "comm_ns": comm_ns,
            "busy_ns": busy, "hidden_ns": hidden, "exposed_ns": comm_ns - hidden}))
    df = pd.concat(out, ignore_index=True)
    df = df[(df["kind"] == ALL) | (df["comm_ns"] > 0) | (df["calls"] > 0)].reset_index(drop=True)
    df["overlap_ratio"] = (df["hidden_ns"] / df["comm_ns"].where(df["comm_ns"] > 0)).astype(float)
    return df


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=["rank", "step", "kind", "calls", "comm_ns", "busy_ns", "hidden_ns",
                                 "exposed_ns", "overlap_ratio"])


def window_overlap(win: Window) -> pd.DataFrame:
    """Overlap rows of every rank in a window."""
    parts = [rank_overlap(rw, win.comm[win.comm["rank"] == rank]) for rank, rw in win.ranks.items()]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else _empty()
