"""Who made the accelerators wait: the devices' half of the delay analysis (docs/causes.md, "On
the accelerators").

On a GPU trace the hosts launch and go on; the waiting happens inside the collective kernels
(NCCL/RCCL on accelerator streams), each of which spins until the last rank's kernel of the same
collective starts. Those kernels are matched across ranks like any collective, so each has its
``wait_ns``. Here each wait is given to the rank whose kernel started last, and the difference
between its kernel's start and a waiter's is split exactly into three parts:

- ``late_start``: how much later the cause's host step began;
- the host's regions: how much longer the cause's main thread spent in each region between its
  step's start and the kernel's launch (``correlations``) than the waiter's did;
- ``device_queue``: how much longer the cause's kernel sat between its launch and its start
  (its device was busy, or the stream waited for other work).

The wait is split over the positive parts in proportion, as the hosts' delays are
(:mod:`analyze.tables.causes.delays`); a pair without launches in the trace is ``unknown``.

The devices' critical path (:func:`device_paths`) walks each step back as the host's critical
path does (:func:`analyze.tables.causes.critical_path.walk`), through these waits instead of
the main threads' idle time.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analyze.tables.causes.critical_path import chain_of, walk
from analyze.tables.causes.region_time import NO_REGION, NO_REGION_NAME, region_times
from analyze.tables.causes.window import all_steps
from analyze.tables.device_phases import COMM, device_activity
from analyze.tables.steps import StepBins, top_and_rest

LATE_START, REGION, DEVICE_QUEUE, UNKNOWN = "late_start", "region", "device_queue", "unknown"


# The collective kernels matched across ranks (dc), each with the host step it starts in, its
# launch's start (the kernel's CPU call in correlations) and the end of the previous collective
# kernel on its stream (dcs; kernels outside every step are left out), and per collective the
# rank whose kernel started last (cause; the lowest rank on a tie).
_KERNELS = """
        dc AS (
            SELECT c.location_id, c.interval_idx, c.rank, c.comm_id, c.seq, c.op, c.enter_ns, c.leave_ns,
                   c.wait_ns, c.last_arrival_ns, c.ranks_matched,
                   lag(c.leave_ns) OVER (PARTITION BY c.location_id ORDER BY c.enter_ns, c.seq) AS prev_leave_ns
            FROM collectives c JOIN locations l USING (location_id)
            WHERE l.kind = 'accelerator_stream' AND c.ranks_matched > 1
        ),
        launch AS (SELECT location_id, idx, min(launch_start_ns) AS launch_ns FROM correlations GROUP BY ALL),
        dcs AS (
            SELECT dc.*, s.step, s.start_ns AS step_start_ns, k.launch_ns
            FROM dc ASOF JOIN steps s ON s.rank = dc.rank AND dc.enter_ns >= s.start_ns
            LEFT JOIN launch k ON k.location_id = dc.location_id AND k.idx = dc.interval_idx
            WHERE dc.enter_ns < s.end_ns
        ),
        cause AS (
            SELECT * FROM dcs WHERE enter_ns = last_arrival_ns
            QUALIFY row_number() OVER (PARTITION BY comm_id, seq ORDER BY rank) = 1
        )"""


def _has_devices(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the run has accelerator streams (else nothing here scans its collectives)."""
    return con.execute("SELECT count(*) > 0 FROM locations WHERE kind = 'accelerator_stream'").fetchall() == [(True,)]


def _merged(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted disjoint intervals."""
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.concatenate([[True], s[1:] > e[:-1]])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [len(s)]]) - 1
    return s[first], e[last]


def _covered(ms: np.ndarray, me: np.ndarray, b: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Per query [b, e): how much of it the disjoint sorted intervals [ms, me) cover."""
    if not len(ms):
        return np.zeros(len(b), np.int64)
    before = np.concatenate([[0], np.cumsum(me - ms)])  # covered before interval k

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(ms, t, side="right") - 1
        inside = np.clip(t - ms[np.maximum(k, 0)], 0, (me - ms)[np.maximum(k, 0)])
        return np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0)

    return np.maximum(upto(e) - upto(b), 0)


def device_wait_instances(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Collective kernels (NCCL/RCCL on accelerator streams, matched across ranks) wait inside
    the kernel for the last rank's kernel to start. Per collective instance some rank waited
    in: ``cause_rank`` (the last to start; the lowest rank on a tie), its ``step``, the summed
    ``wait_ns`` of the others and how many ``waiting``; what its device did in the stretch
    before its kernel started (from its previous collective kernel's end, or its step's start,
    to its kernel's start), ``before_ns`` long: ``busy_ns`` in kernels and copies, the rest
    idle (the host launched the kernel late); and how many ranks of the collective's group the
    trace holds (``matched``, of ``group_size``). Empty without device collectives; why the
    cause was late is :func:`device_wait_causes`."""
    columns = ["cause_rank", "step", "wait_ns", "waiting", "before_ns", "busy_ns", "matched", "group_size"]
    if not _has_devices(con):
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in columns})
    inst = con.execute(f"""
        WITH {_KERNELS},
        waited AS (
            SELECT comm_id, seq, sum(wait_ns) AS wait_ns, count(*) FILTER (WHERE wait_ns > 0) AS waiting,
                   max(ranks_matched) AS matched
            FROM dcs GROUP BY comm_id, seq HAVING sum(wait_ns) > 0
        )
        SELECT c.rank AS cause_rank, w.wait_ns, w.waiting, c.step, c.enter_ns,
               greatest(coalesce(c.prev_leave_ns, c.step_start_ns), c.step_start_ns) AS from_ns,
               w.matched, len(m.members) AS group_size
        FROM cause c JOIN waited w USING (comm_id, seq) LEFT JOIN communicators m USING (comm_id)
    """).df()
    busy = np.zeros(len(inst), np.int64)
    act = device_activity(con)  # one query for every rank: a query a rank costs ~10 ms at thousands
    act = act[act["kind"].to_numpy() != COMM]  # kernels and copies, not communication
    by_rank = act.groupby("rank").indices
    for rank, rows in inst.groupby("cause_rank").indices.items():
        mine = by_rank.get(rank, np.zeros(0, np.int64))
        ms_, me_ = _merged(act["start_ns"].to_numpy(np.int64)[mine], act["end_ns"].to_numpy(np.int64)[mine])
        busy[rows] = _covered(ms_, me_, inst["from_ns"].to_numpy(np.int64)[rows],
                              inst["enter_ns"].to_numpy(np.int64)[rows])
    before = np.maximum(inst["enter_ns"].to_numpy(np.int64) - inst["from_ns"].to_numpy(np.int64), 0)
    return inst.assign(before_ns=before, busy_ns=np.minimum(busy, before))[columns]


def device_waits(con: duckdb.DuckDBPyConnection, inst: pd.DataFrame | None = None) -> pd.DataFrame:
    """Who made the accelerators wait (:func:`device_wait_instances`), per cause rank, largest
    first: the ``instances`` it was last in, the summed wait of the others (ms) and its
    ``share`` of all, the most ranks that waited, its steps, the stretches before its kernels
    (``before_ms``) split into ``busy_ms`` and ``idle_ms``, and the fewest ranks of its
    collectives' groups in the trace (``traced``) against the largest group (``group_size``):
    a trace of some ranks only cannot see a later rank it lacks. ``inst``: the instances, if
    already computed."""
    inst = device_wait_instances(con) if inst is None else inst
    columns = ["cause_rank", "instances", "wait_ms", "waiting_ranks", "steps", "before_ms", "busy_ms",
               "idle_ms", "share", "traced", "group_size"]
    if inst.empty:
        return pd.DataFrame({c: [] for c in columns})
    inst = inst.rename(columns={"before_ns": "before", "busy_ns": "busy"})
    total = inst["wait_ns"].sum()
    out = inst.groupby("cause_rank").agg(
        instances=("wait_ns", "size"), wait=("wait_ns", "sum"), waiting_ranks=("waiting", "max"),
        steps=("step", lambda s: sorted(set(int(x) for x in s))), before=("before", "sum"), busy=("busy", "sum"),
        traced=("matched", "min"), group_size=("group_size", "max"),
    ).reset_index()
    return pd.DataFrame({
        "cause_rank": out["cause_rank"].astype(int), "instances": out["instances"],
        "wait_ms": out["wait"] / 1e6, "waiting_ranks": out["waiting_ranks"], "steps": out["steps"],
        "before_ms": out["before"] / 1e6, "busy_ms": out["busy"] / 1e6,
        "idle_ms": (out["before"] - out["busy"]) / 1e6, "share": out["wait"] / total,
        "traced": out["traced"], "group_size": out["group_size"],
    }).sort_values(["wait_ms", "cause_rank"], ascending=[False, True], ignore_index=True)


def device_wait_steps(con: duckdb.DuckDBPyConnection, top: int = 5, bins: StepBins | None = None,
                      inst: pd.DataFrame | None = None) -> pd.DataFrame:
    """step, cause ("rank N"; ranks past the ``top`` largest are "other ranks"), ms: the waiting
    in collective kernels per step, summed over the ranks that waited, by the rank whose kernel
    started last (with ``bins``, per mean step of each bin, as :func:`cause_steps`)."""
    inst = device_wait_instances(con) if inst is None else inst
    if inst.empty:
        return pd.DataFrame({"step": [], "cause": [], "ms": []})
    order = inst.groupby("cause_rank")["wait_ns"].sum().sort_values(ascending=False, kind="stable")
    con.register("device_wait_rows", inst)
    try:
        df = (bins or StepBins(0, 0, 1)).sums(con, "device_wait_rows", ["cause_rank"], "wait_ns")
    finally:
        con.unregister("device_wait_rows")
    return top_and_rest(df, [f"rank {r}" for r in df["cause_rank"]], [f"rank {r}" for r in order.index[:top]],
                        "other ranks")


def device_wait_causes(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Why the last rank's collective kernels started late (the module's three parts): per
    cause rank and part, the waiting it caused, largest first. Columns cause_rank, kind
    (``late_start``, ``region``, ``device_queue`` or ``unknown``), region (the host region's name
    for kind region, ``(no region)`` for main-thread time in none; else empty) and ms."""
    empty = pd.DataFrame({"cause_rank": [], "kind": [], "region": [], "ms": []})
    if not _has_devices(con):
        return empty
    pairs = con.execute(f"""
        WITH {_KERNELS}
        SELECT c.rank AS cause_rank, c.step AS c_step, c.step_start_ns AS c_start, c.launch_ns AS c_launch,
               c.enter_ns AS c_enter, w.rank AS w_rank, w.step AS w_step, w.step_start_ns AS w_start,
               w.launch_ns AS w_launch, w.enter_ns AS w_enter, w.wait_ns
        FROM cause c JOIN dcs w ON w.comm_id = c.comm_id AND w.seq = c.seq AND w.wait_ns > 0 AND w.rank <> c.rank
    """).df()
    if pairs.empty:
        return empty
    pairs["pair"] = np.arange(len(pairs))
    known = pairs["c_launch"].notna() & pairs["w_launch"].notna()
    known &= (pairs["c_launch"] >= pairs["c_start"]) & (pairs["w_launch"] >= pairs["w_start"])
    parts = [pairs.loc[~known, ["pair"]].assign(kind=UNKNOWN, region=-3, ns=1.0)]
    ok = pairs[known].astype({c: np.int64 for c in ("c_launch", "w_launch")})
    if len(ok):
        # each side's main-thread time per region from its step's start to its launch
        sides = {side: ok[["pair", f"{side}_rank" if side == "w" else "cause_rank", f"{side}_step", f"{side}_start",
                           f"{side}_launch"]].set_axis(["pair", "rank", "step", "b", "e"], axis=1)
                 for side in ("c", "w")}
        queries = pd.concat(sides.values()).drop_duplicates(["rank", "step", "b", "e"]).reset_index(drop=True)
        got = region_times(con, queries["rank"].to_numpy(), queries["step"].to_numpy(), queries["b"].to_numpy(),
                           queries["e"].to_numpy())
        got = got.merge(queries.assign(q=np.arange(len(queries))), on="q")[["rank", "step", "b", "e", "region", "ns"]]
        per_side = {side: sides[side].merge(got, on=["rank", "step", "b", "e"])[["pair", "region", "ns"]]
                    for side in ("c", "w")}
        regions = per_side["c"].merge(per_side["w"], on=["pair", "region"], how="outer", suffixes=("_c", "_w"))
        regions = regions.fillna({"ns_c": 0, "ns_w": 0})
        parts.append(regions.assign(kind=REGION, ns=regions["ns_c"] - regions["ns_w"])[["pair", "kind", "region", "ns"]])
        parts.append(ok[["pair"]].assign(kind=LATE_START, region=-3, ns=ok["c_start"] - ok["w_start"]))
        parts.append(ok[["pair"]].assign(kind=DEVICE_QUEUE, region=-3,
                                         ns=(ok["c_enter"] - ok["c_launch"]) - (ok["w_enter"] - ok["w_launch"])))
    terms = pd.concat(parts, ignore_index=True)
    terms = terms[terms["ns"] > 0]
    total = terms.groupby("pair")["ns"].transform("sum")
    waits = pairs.set_index("pair")["wait_ns"]
    terms = terms.assign(wait=terms["ns"] / total * waits.loc[terms["pair"]].to_numpy(),
                         cause_rank=pairs.set_index("pair")["cause_rank"].loc[terms["pair"]].to_numpy())
    out = terms.groupby(["cause_rank", "kind", "region"], as_index=False)["wait"].sum()
    names = dict(con.execute("SELECT region_id, name FROM regions").fetchall())
    names[NO_REGION] = NO_REGION_NAME
    out["region"] = [names.get(int(r), "") if k == REGION else "" for k, r in zip(out["kind"], out["region"], strict=True)]
    return pd.DataFrame({"cause_rank": out["cause_rank"].astype(int), "kind": out["kind"], "region": out["region"],
                         "ms": out["wait"] / 1e6}).sort_values(["ms", "cause_rank"], ascending=[False, True],
                                                               ignore_index=True)


def device_paths(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per step, the critical path through the accelerators' collective kernels, as
    ``critical_path`` rows (step, hop, rank, start_ns, end_ns, duration_ns, via). Walked back
    from the end of the step on the rank whose host step ended last (the steps' windows, as
    device_phases uses them), a rank's stretch ends going back at the end of a wait inside one
    of its collective kernels, where the path jumps to the rank whose kernel started last, at
    that start; ``via`` names the kernel's op ("allreduce kernel", or "collective kernel" when
    the trace does not say). The host's critical path cannot see these waits: on a GPU trace
    the hosts launch and go on, and their idle time is empty. Empty without waits in
    collective kernels."""
    if not _has_devices(con):
        return chain_of([], [], [], [], [])
    waits = con.execute(f"""
        WITH {_KERNELS}
        SELECT w.step, w.rank, w.enter_ns, w.enter_ns + w.wait_ns AS end_ns, c.rank AS cause_rank,
               c.enter_ns AS cause_enter_ns, coalesce(w.op, 'collective') || ' kernel' AS via
        FROM dcs w JOIN cause c ON c.comm_id = w.comm_id AND c.seq = w.seq AND c.rank <> w.rank
        WHERE w.wait_ns > 0
    """).fetchall()
    if not waits:
        return chain_of([], [], [], [], [])
    st = all_steps(con)
    by_step: dict[int, dict[int, tuple[int, int]]] = {}
    for rank, step, start, end in zip(st["rank"].tolist(), st["step"].tolist(), st["start_ns"].tolist(),
                                      st["end_ns"].tolist(), strict=True):
        by_step.setdefault(step, {})[rank] = (start, end)
    of_step: dict[int, list[tuple[int, int, int, int, int, str]]] = {}
    for step, *wait in waits:
        of_step.setdefault(int(step), []).append(tuple(wait))  # type: ignore[arg-type]
    hops: list[tuple[int, int, int, int, str | None]] = []
    for step in sorted(by_step):
        path = walk(by_step[step], of_step.get(step, []))
        hops += [(step, r, x, y, via) for r, x, y, via in reversed(path) if y > x or len(path) == 1]
    return chain_of(*(list(column) for column in zip(*hops, strict=True))) if hops else chain_of([], [], [], [], [])
