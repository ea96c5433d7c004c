"""The phase model on the device timeline: per rank and step, where the accelerator's time goes,
and what the host's main thread was doing meanwhile.

Device activity is every kernel, memory copy or set on the rank's accelerator streams
(GPU-side annotations are not activity). Per elementary interval of time, over the union of
all the rank's streams:

- ``comm_hidden``: a communication kernel (one that performs a collective) runs while a
  compute kernel runs too: the communication costs nothing;
- ``compute``: compute kernels run, no communication;
- ``comm_exposed``: communication runs and no compute kernel does: the device waits for it;
- ``memory``: only copies or sets run;
- ``idle``: nothing runs on any stream (the device waits for the host: data loading,
  Python, launch overhead, a synchronization).

Steps are the windows of the ``steps`` table (the same as the host-side phases), so the device
phases of a step add up to its duration. Each piece is also labelled with what the main thread
was in (the innermost of: collective, wait, data loading, optimizer, backward, forward; else
other), so "the GPU was idle while the host loaded data" and "NCCL was exposed after backward"
are both queries over one table.

:func:`device_breakdown` gives Holistic Trace Analysis's temporal breakdown (idle, compute,
non-compute over each rank's first-to-last device activity) from the same intervals, for
comparison; docs/gpu.md explains where the two differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import Category, DevicePhase, HostActivity
from analyze.tables.phases import _step_of
from analyze.tables.steps import rank_group_sql

COMPUTE, COMM, MEMORY = range(3)
DEVICE_PHASES = [DevicePhase.COMPUTE, DevicePhase.COMM_HIDDEN, DevicePhase.COMM_EXPOSED,
                 DevicePhase.MEMORY, DevicePhase.IDLE]
# host levels in order of preference (inner regions first); OTHER when none covers
HOST = [HostActivity.COLLECTIVE, HostActivity.WAIT, HostActivity.DATALOADER, HostActivity.OPTIMIZER,
        HostActivity.BACKWARD, HostActivity.FORWARD, HostActivity.OTHER]
_HOST_CATEGORY = {Category.COLLECTIVE: 0, Category.P2P: 0, Category.WAIT: 1, Category.DATALOADER: 2,
                  Category.OPTIMIZER: 3, Category.BACKWARD: 4, Category.FORWARD: 5}
# Score-P writes CUDA kernels as functions of paradigm cuda on accelerator streams
ACCELERATOR_PARADIGMS = ("cuda", "hip", "opencl", "openacc", "openmp_target")


def device_activity(con: duckdb.DuckDBPyConnection, rank: int | None = None,
                    window: tuple[int, int] | None = None) -> pd.DataFrame:
    """rank, location_id (the stream), start_ns, end_ns, kind (0 compute, 1 communication, 2
    memory) of every device activity (of ``rank``, or of all ranks; overlapping ``window``
    [ns, half-open], when given)."""
    where = "" if rank is None else f"AND l.rank = {int(rank)}"
    if window is not None:
        where += f" AND i.end_ns > {int(window[0])} AND i.start_ns < {int(window[1])}"
    return con.execute(f"""
        WITH c AS (SELECT DISTINCT location_id, interval_idx FROM collectives)
        SELECT l.rank, i.location_id, i.start_ns, i.end_ns,
               CASE WHEN c.interval_idx IS NOT NULL OR r.category = '{Category.COLLECTIVE}' THEN {COMM}
                    WHEN r.category = '{Category.MEMORY}' THEN {MEMORY}
                    ELSE {COMPUTE} END AS kind
        FROM intervals i JOIN locations l USING (location_id) JOIN regions r USING (region_id)
        LEFT JOIN c ON c.location_id = i.location_id AND c.interval_idx = i.idx
        WHERE l.kind = 'accelerator_stream' {where}
          AND (r.category IN ('{Category.KERNEL}', '{Category.MEMORY}', '{Category.COLLECTIVE}')
               OR c.interval_idx IS NOT NULL
               OR (r.paradigm IN {ACCELERATOR_PARADIGMS} AND r.role IN ('function', 'kernel')))
    """).df()


def _host(con: duckdb.DuckDBPyConnection, rank: int) -> pd.DataFrame:
    cases = " ".join(f"WHEN '{c}' THEN {lvl}" for c, lvl in _HOST_CATEGORY.items())
    listed = ", ".join(f"'{c}'" for c in _HOST_CATEGORY)
    return con.execute(f"""
        SELECT i.start_ns, i.end_ns, CASE r.category {cases} END AS level
        FROM intervals i JOIN locations l USING (location_id) JOIN regions r USING (region_id)
        WHERE l.is_main AND l.rank = $r AND r.category IN ({listed})
    """, {"r": rank}).df()


def _cover(bounds: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per elementary interval [bounds[i], bounds[i+1]): whether any [start, end) covers it."""
    delta = np.zeros(len(bounds) + 1, dtype=np.int64)
    np.add.at(delta, np.searchsorted(bounds, start), 1)
    np.add.at(delta, np.searchsorted(bounds, end), -1)
    return np.cumsum(delta)[: len(bounds) - 1] > 0


def split(dev_start: np.ndarray, dev_end: np.ndarray, dev_kind: np.ndarray,
          host_start: np.ndarray, host_end: np.ndarray, host_level: np.ndarray,
          step_start: np.ndarray, step_end: np.ndarray) -> np.ndarray:
    """ns per (step, device phase, host activity): an int64 array (steps x 5 x 7), indexed by
    :data:`DEVICE_PHASES` and :data:`HOST`. Intervals are half-open; steps must not overlap."""
    n_steps = len(step_start)
    out = np.zeros((n_steps, len(DEVICE_PHASES), len(HOST)), dtype=np.int64)
    keep = dev_end > dev_start
    dev_start, dev_end, dev_kind = dev_start[keep], dev_end[keep], dev_kind[keep]
    keep = host_end > host_start
    host_start, host_end, host_level = host_start[keep], host_end[keep], host_level[keep]
    bounds = np.unique(np.concatenate([dev_start, dev_end, host_start, host_end, step_start, step_end]))
    if n_steps == 0 or len(bounds) < 2:
        return out
    covered = [_cover(bounds, dev_start[dev_kind == k], dev_end[dev_kind == k]) for k in (COMPUTE, COMM, MEMORY)]
    compute, comm, memory = covered
    phase = np.select([comm & compute, compute, comm, memory],
                      [1, 0, 2, 3], default=4)  # indices into DEVICE_PHASES
    host = np.full(len(bounds) - 1, len(HOST) - 1)
    for level in range(len(HOST) - 2, -1, -1):  # the first covering level wins
        mine = host_level == level
        if mine.any():
            host[_cover(bounds, host_start[mine], host_end[mine])] = level
    step = _step_of(bounds[:-1], step_start, step_end)
    valid = step >= 0
    flat = (step[valid] * len(DEVICE_PHASES) + phase[valid]) * len(HOST) + host[valid]
    out += np.bincount(flat, weights=np.diff(bounds)[valid],
                       minlength=out.size).astype(np.int64).reshape(out.shape)
    return out


def build_device_phases(con: duckdb.DuckDBPyConnection, emit: Callable[[dict[str, np.ndarray]], None],
                        ranks: Sequence[int] | None = None) -> None:
    """The ``device_phases`` rows (non-zero ones only) of every rank with accelerator streams
    (of ``ranks`` when given), a rank at a time to ``emit`` (views intervals, locations,
    regions, steps, collectives)."""
    only = "" if ranks is None else "AND rank IN (" + ", ".join(str(int(r)) for r in ranks) + ")" \
        if len(ranks) else "AND false"
    found = [r for (r,) in con.execute(f"""
        SELECT DISTINCT rank FROM locations WHERE kind = 'accelerator_stream' {only} ORDER BY rank""").fetchall()]
    for rank in found:
        st = con.execute("SELECT step, start_ns, end_ns FROM steps WHERE rank = $r ORDER BY start_ns",
                         {"r": rank}).fetchnumpy()
        if not len(st["step"]):
            continue
        dev = device_activity(con, rank)
        host = _host(con, rank)
        totals = split(dev["start_ns"].to_numpy(np.int64), dev["end_ns"].to_numpy(np.int64),
                       dev["kind"].to_numpy(np.int64), host["start_ns"].to_numpy(np.int64),
                       host["end_ns"].to_numpy(np.int64), host["level"].to_numpy(np.int64),
                       np.asarray(st["start_ns"], np.int64), np.asarray(st["end_ns"], np.int64))
        s, p, h = np.nonzero(totals)
        emit({
            "rank": np.full(len(s), rank, dtype=np.int32),
            "step": np.asarray(st["step"], np.int32)[s],
            "phase": np.array([str(DEVICE_PHASES[i]) for i in p], dtype=object),
            "host": np.array([str(HOST[i]) for i in h], dtype=object),
            "duration_ns": totals[s, p, h],
        })


def _union(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of [start, end) intervals."""
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    gaps = np.maximum(s[1:] - e[:-1], 0)
    return int(e[-1] - s[0] - gaps.sum())


def device_breakdown(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per rank, Holistic Trace Analysis's temporal breakdown from our intervals: over the span
    from the first device activity's start to the last one's end, ``idle_ns`` (no activity on
    any stream), ``compute_ns`` (union of compute kernels) and ``non_compute_ns`` (the rest:
    communication and memory not under compute); they add up to ``span_ns``."""
    dev = device_activity(con)
    rows = []
    for rank, d in dev.groupby("rank", sort=True):
        start, end, kind = (d[c].to_numpy(np.int64) for c in ("start_ns", "end_ns", "kind"))
        span = int(end.max() - start.min())
        busy = _union(start, end)
        compute = _union(start[kind == COMPUTE], end[kind == COMPUTE])
        rows.append((int(rank), span - busy, compute, busy - compute, span))
    return pd.DataFrame(rows, columns=["rank", "idle_ns", "compute_ns", "non_compute_ns", "span_ns"])


def summary(con: duckdb.DuckDBPyConnection, per: int = 1) -> pd.DataFrame:
    """Per rank with accelerator streams: steps and each device phase as a percentage of step
    time, and ``host_wait%``: the share of step time the main thread spent in a wait
    (HostActivity.WAIT: ``cudaStreamSynchronize`` and the like), whatever its device did, which
    the hosts' phases count as compute unless it waits on communication; with ``per`` > 1 per
    group of consecutive ranks, as :func:`.phases.summary`."""
    key, first, steps = rank_group_sql(per)
    found = con.execute("SELECT EXISTS (SELECT 1 FROM device_phases)").fetchone()
    if not (found and found[0]):  # most traces have no accelerator streams: no aggregation of steps
        columns = ["rank", "steps"] if per == 1 else ["ranks", "steps/rank"]
        return pd.DataFrame(columns=[*columns, *(f"{p}%" for p in DEVICE_PHASES), "host_wait%"])
    ns = ", ".join([*(f"sum(duration_ns) FILTER (WHERE phase = '{p}') AS \"{p}\"" for p in DEVICE_PHASES),
                    f"sum(duration_ns) FILTER (WHERE host = '{HostActivity.WAIT}') AS host_wait"])
    pct = ", ".join(f"round(100.0 * d.\"{p}\" / nullif(s.total, 0), 1) AS \"{p}%\""
                    for p in [*DEVICE_PHASES, "host_wait"])
    return con.execute(f"""
        WITH s AS (SELECT {key} AS g, {first}, {steps}, sum(duration_ns) AS total
                   FROM steps WHERE rank IN (SELECT rank FROM device_phases) GROUP BY ALL),
             d AS (SELECT {key} AS g, {ns} FROM device_phases GROUP BY ALL)
        SELECT s.* EXCLUDE (g, total), {pct}
        FROM s JOIN d USING (g) ORDER BY s.g
    """).df()
