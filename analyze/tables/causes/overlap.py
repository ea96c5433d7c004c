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

from collections.abc import Mapping

import numpy as np
import pandas as pd

from analyze.tables.causes.window import (
    COMPUTE,
    RankWindow,
    Window,
    coverage,
    step_index,
)
from analyze.tables.phases import split_by_rank

ALL = "all"


COLUMNS = ["rank", "step", "kind", "calls", "comm_ns", "busy_ns", "hidden_ns", "exposed_ns"]


def rank_overlap(rw: RankWindow, comm: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Overlap columns (:data:`COLUMNS`) of one rank's steps in a window; ``comm``: that
    rank's communication intervals (start, end, kind); None: no rows. In numpy only: a
    window of 4,096 ranks makes it 4,096 times."""
    n_steps = len(rw.steps)
    if len(rw.bounds) < 2 or n_steps == 0:
        return None
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
        mine = comm["kind"] == kind
        s, e = comm["start"][mine], comm["end"][mine]
        count = coverage(rw.bounds, s, e)  # operations of this kind in flight
        at = step_index(s, rw.step_start, rw.step_end)
        calls = np.bincount(at[at >= 0], minlength=n_steps).astype(np.int64)
        busy = per_step(length * count)
        rows.append((kind, count > 0, calls, busy))
        any_cover |= count > 0
        busy_all += busy
        calls_all += calls
    rows.append((ALL, any_cover, calls_all, busy_all))
    comm_ns = np.concatenate([per_step(length * covered) for _, covered, _, _ in rows])
    hidden = np.concatenate([per_step(length * (covered & computing)) for _, covered, _, _ in rows])
    kinds = np.repeat(np.array([kind for kind, _, _, _ in rows], dtype=object), n_steps)
    calls = np.concatenate([calls for _, _, calls, _ in rows])
    keep = (kinds == ALL) | (comm_ns > 0) | (calls > 0)
    return {"rank": np.full(int(keep.sum()), rw.rank, np.int64), "step": np.tile(rw.steps, len(rows))[keep],
            "kind": kinds[keep], "calls": calls[keep], "comm_ns": comm_ns[keep],
            "busy_ns": np.concatenate([busy for _, _, _, busy in rows])[keep], "hidden_ns": hidden[keep],
            "exposed_ns": (comm_ns - hidden)[keep]}


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=[*COLUMNS, "overlap_ratio"])


def window_overlap(win: Window) -> pd.DataFrame:
    """Overlap rows of every rank in a window (:data:`COLUMNS` and overlap_ratio)."""
    columns = {"start": win.comm["start"].to_numpy(np.int64), "end": win.comm["end"].to_numpy(np.int64),
               "kind": win.comm["kind"].to_numpy(object), "rank": win.comm["rank"].to_numpy(np.int64)}
    comm_of = split_by_rank(columns)
    none = {k: v[:0] for k, v in columns.items()}
    parts = [p for p in (rank_overlap(rw, comm_of.get(rank, none)) for rank, rw in win.ranks.items())
             if p is not None and len(p["rank"])]
    if not parts:
        return _empty()
    df = pd.DataFrame({c: np.concatenate([p[c] for p in parts]) for c in COLUMNS})
    df["overlap_ratio"] = (df["hidden_ns"] / df["comm_ns"].where(df["comm_ns"] > 0)).astype(float)
    return df
