"""What the CLI prints and the report pages draw from the cause tables (read-only queries).

Sentences and small tables for ``analyze causes / overlap / critical-path``, and the frames
the figures of :mod:`reports.causes` are drawn from (times in milliseconds).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import CauseKind, DevicePhase
from analyze.tables.device_phases import COMM, device_activity
from analyze.tables.steps import RankGroups, StepBins, rank_group_sql


def step_ranges(steps: list[int], most: int = 4) -> str:
    """[1, 2, 3, 7] -> "steps 1-3, 7"; [4] -> "step 4"; long lists end in "..."."""
    steps = sorted(set(steps))
    if not steps:
        return "no step"
    runs: list[tuple[int, int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    shown = ", ".join(parts[:most]) + (", ..." if len(parts) > most else "")
    return f"step {shown}" if len(steps) == 1 else f"steps {shown}"


def ms(ns: float) -> str:
    """120.0 ms, 1.25 ms, 0.0123 ms: a tenth of a millisecond, or three significant digits below 10 ms;
    below a microsecond in nanoseconds (40 ns, not 4e-05 ms)."""
    v = ns / 1e6
    if 0 < ns < 1000:
        return f"{ns:.3g} ns"
    return f"{v:.1f} ms" if v >= 10 else f"{v:.3g} ms"


def delay_lines(con: duckdb.DuckDBPyConnection, limit: int = 10) -> list[str]:
    """One sentence per cause, largest first: "rank 3's dltrace.dataloader at steps 7-9
    caused 120.0 ms of idle on 7 ranks (40% of all idle)"."""
    rows = con.execute("""
        SELECT cause_rank, cause_kind, cause_region, idle_ns, share, waiting_ranks, main_steps
        FROM delay_totals ORDER BY idle_ns DESC, cause_rank, cause_region LIMIT $n
    """, {"n": limit}).fetchall()
    out = []
    for rank, kind, region, idle_ns, share, waiting, steps in rows:
        if kind == CauseKind.REGION:
            who = f"rank {rank}'s {region}"
        elif kind == CauseKind.LATE_START:
            who = f"rank {rank} starting late (a delay from before the synchronization interval)"
        else:
            who = "an unknown rank"
        ranks = f"{waiting} rank{'s' if waiting != 1 else ''}"
        pct = f" ({100 * share:.0f}% of all idle)" if share is not None else ""
        out.append(f"{who} at {step_ranges(list(steps or []))} caused {ms(idle_ns)} of idle "
                   f"on {ranks}{pct}")
    return out


def overlap_summary(con: duckdb.DuckDBPyConnection, per: int = 1) -> pd.DataFrame:
    """Per rank (or group of ``per`` consecutive ranks) and kind: mean ms per step of
    communication, hidden and exposed, and the overlap ratio over the whole run."""
    key, first, steps = rank_group_sql(per)
    return con.execute(f"""
        SELECT {first}, kind, {steps}, sum(calls) / count(*) AS calls_per_step,
               round(avg(comm_ns) / 1e6, 3) AS comm_ms, round(avg(busy_ns) / 1e6, 3) AS busy_ms,
               round(avg(hidden_ns) / 1e6, 3) AS hidden_ms, round(avg(exposed_ns) / 1e6, 3) AS exposed_ms,
               round(sum(hidden_ns) / nullif(sum(comm_ns), 0), 3) AS overlap
        FROM overlap GROUP BY {key}, kind
        ORDER BY {key}, kind = 'all' DESC, kind
    """).df()


def device_overlap_summary(con: duckdb.DuckDBPyConnection, per: int = 1) -> pd.DataFrame:
    """Per rank (or group of ``per`` consecutive ranks), the device's view (device_phases;
    empty without accelerator streams): mean ms per step of communication kernels, the part
    overlapped by compute kernels, the exposed part and the overlap ratio over the run
    (Holistic Trace Analysis's comm/comp overlap)."""
    key, first, steps = rank_group_sql(per)
    return con.execute(f"""
        WITH s AS (
            SELECT rank, step, sum(duration_ns) FILTER (WHERE phase = '{DevicePhase.COMM_HIDDEN}') AS hidden,
                   sum(duration_ns) FILTER (WHERE phase = '{DevicePhase.COMM_EXPOSED}') AS exposed
            FROM device_phases GROUP BY rank, step
        )
        SELECT {first}, {steps}, round(avg(coalesce(hidden, 0) + coalesce(exposed, 0)) / 1e6, 3) AS comm_ms,
               round(avg(coalesce(hidden, 0)) / 1e6, 3) AS hidden_ms, round(avg(coalesce(exposed, 0)) / 1e6, 3) AS exposed_ms,
               round(sum(hidden) / nullif(sum(coalesce(hidden, 0) + coalesce(exposed, 0)), 0), 3) AS overlap
        FROM s GROUP BY {key} HAVING sum(coalesce(hidden, 0) + coalesce(exposed, 0)) > 0 ORDER BY {key}
    """).df()


def critical_path_summary(con: duckdb.DuckDBPyConnection, limit: int | None = None) -> pd.DataFrame:
    """Per step: path length, perfect-balance time, imbalance cost and who is on the path.
    With ``limit``, only the ``limit`` steps of the largest imbalance cost (in step order)."""
    pick = "" if limit is None else f"ORDER BY imbalance_ns DESC, step LIMIT {int(limit)}"
    return con.execute(f"""
        SELECT step, round(duration_ns / 1e6, 3) AS path_ms, round(balanced_ns / 1e6, 3) AS balanced_ms,
               round(imbalance_ns / 1e6, 3) AS imbalance_ms,
               round(100.0 * imbalance_ns / nullif(duration_ns, 0), 1) AS "imbalance%",
               end_rank, path_ranks, critical_rank, critical_region
        FROM (SELECT * FROM step_balance {pick}) ORDER BY step
    """).df()


def imbalance_total(con: duckdb.DuckDBPyConnection) -> tuple[int, float, float]:
    """(steps, imbalance cost in ms, critical path length in ms) summed over the run's steps."""
    ((steps, cost, total),) = con.execute("""
        SELECT count(*), coalesce(sum(imbalance_ns), 0) / 1e6, coalesce(sum(duration_ns), 0) / 1e6
        FROM step_balance""").fetchall()
    return int(steps), float(cost), float(total)


def path_contributions(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Per rank and region: total time on the critical path across the run, largest first."""
    return con.execute("""
        SELECT rank, region, category, round(sum(duration_ns) / 1e6, 3) AS path_ms,
               round(100.0 * sum(duration_ns) / (SELECT sum(duration_ns) FROM critical_path_regions), 1)
                   AS "path%"
        FROM critical_path_regions GROUP BY ALL ORDER BY sum(duration_ns) DESC, rank, region, category
    """).df()


# --- frames for the report pages -------------------------------------------------------------

def overlap_steps(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None,
                  groups: RankGroups | None = None) -> pd.DataFrame:
    """rank, step, part (hidden, exposed), ms: all communication of each step (with ``bins``,
    of each bin's mean step; with ``groups``, ``rank`` is a group's first rank and ms the mean
    over its ranks)."""
    bins, groups = bins or StepBins(0, 0, 1), groups or RankGroups(1, 0)
    per = f"{bins.width('b')} / any_value(n.n)"
    df = con.execute(f"""
        WITH o AS (SELECT {groups.start()} AS g, {bins.start()} AS b, rank, hidden_ns, exposed_ns
                   FROM overlap WHERE kind = 'all'),
        {groups.sizes("o")}
        SELECT g AS rank, b AS step, sum(hidden_ns) / 1e6 / {per} AS hidden, sum(exposed_ns) / 1e6 / {per} AS exposed
        FROM o JOIN n USING (g) GROUP BY g, b ORDER BY rank, step
    """).df()
    return df.melt(id_vars=["rank", "step"], value_vars=["hidden", "exposed"], var_name="part",
                   value_name="ms")


def cause_label(rank: object, kind: str, region: object) -> str:
    if kind == CauseKind.REGION:
        return f"rank {rank}: {region}"
    if kind == CauseKind.LATE_START:
        return f"rank {rank}: started late"
    return "unknown"


def cause_steps(con: duckdb.DuckDBPyConnection, top: int = 5, bins: StepBins | None = None) -> pd.DataFrame:
    """step, cause (a label; causes past the ``top`` largest are "other causes"), ms: idle
    time per step summed over the ranks that waited, by its cause (with ``bins``, per mean
    step of each bin). Steps are the waiting ranks' steps."""
    totals = con.execute("""SELECT cause_rank, cause_kind, cause_region FROM delay_totals
                            ORDER BY idle_ns DESC, cause_rank, cause_region LIMIT $n""", {"n": top}).fetchall()
    keep = [cause_label(*t) for t in totals]
    bins = bins or StepBins(0, 0, 1)
    df = con.execute(f"""SELECT b AS step, cause_rank, cause_kind, cause_region,
                               sum(idle_ns) / 1e6 / {bins.width('b')} AS ms
                        FROM (SELECT {bins.start()} AS b, cause_rank, cause_kind, cause_region, idle_ns FROM delays)
                        GROUP BY b, cause_rank, cause_kind, cause_region""").df()
    if df.empty:
        return pd.DataFrame({"step": [], "cause": [], "ms": []})
    labels = [cause_label(r, k, g) for r, k, g in zip(df["cause_rank"], df["cause_kind"], df["cause_region"],
                                                      strict=True)]
    df["cause"] = [lab if lab in keep else "other causes" for lab in labels]
    out = df.groupby(["step", "cause"], as_index=False)["ms"].sum()
    order = keep + (["other causes"] if "other causes" in set(out["cause"]) else [])
    out["cause"] = pd.Categorical(out["cause"], categories=order)
    return out


def path_steps(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(step, rank, ms: time on the critical path per step and rank; step, path_ms,
    balanced_ms, n: the path's length and the perfect-balance step time, over n steps). With
    ``bins``, per mean step of each bin, n its steps."""
    bins = bins or StepBins(0, 0, 1)
    width = bins.width("b")
    per_rank = con.execute(f"""SELECT b AS step, rank, sum(duration_ns) / 1e6 / {width} AS ms
                               FROM (SELECT {bins.start()} AS b, rank, duration_ns FROM critical_path)
                               GROUP BY b, rank ORDER BY step, rank""").df()
    steps = con.execute(f"""SELECT b AS step, sum(duration_ns) / 1e6 / {width} AS path_ms,
                                   sum(balanced_ns) / 1e6 / {width} AS balanced_ms, {width} AS n
                            FROM (SELECT {bins.start()} AS b, duration_ns, balanced_ns FROM step_balance)
                            GROUP BY b ORDER BY step""").df()
    return per_rank, steps


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
    idle (the host launched the kernel late); how many ranks of the collective's group the
    trace holds (``matched``, of ``group_size``); and how much later the cause's host step began
    than the waiters' (``late_start_ns``, their mean weighted by each one's wait): a delay from
    before the step. Empty without device collectives."""
    columns = ["cause_rank", "step", "wait_ns", "waiting", "before_ns", "busy_ns", "matched", "group_size",
               "late_start_ns"]
    if con.execute("SELECT count(*) FROM locations WHERE kind = 'accelerator_stream'").fetchall() == [(0,)]:
        return pd.DataFrame({c: np.zeros(0, np.int64) for c in columns})  # not a scan of every collective
    inst = con.execute("""
        WITH dc AS (
            SELECT c.rank, c.comm_id, c.seq, c.enter_ns, c.leave_ns, c.wait_ns, c.last_arrival_ns, c.ranks_matched,
                   lag(c.leave_ns) OVER (PARTITION BY c.location_id ORDER BY c.enter_ns, c.seq) AS prev_leave_ns
            FROM collectives c JOIN locations l USING (location_id)
            WHERE l.kind = 'accelerator_stream' AND c.ranks_matched > 1
        ),
        -- each kernel with the host step it starts in
        dcs AS (
            SELECT dc.*, s.step, s.start_ns AS step_start_ns
            FROM dc ASOF JOIN steps s ON s.rank = dc.rank AND dc.enter_ns >= s.start_ns
            WHERE dc.enter_ns < s.end_ns
        ),
        waited AS (
            SELECT comm_id, seq, any_value(last_arrival_ns) AS last_ns, sum(wait_ns) AS wait_ns,
                   count(*) FILTER (WHERE wait_ns > 0) AS waiting, max(ranks_matched) AS matched
            FROM dc GROUP BY comm_id, seq HAVING sum(wait_ns) > 0
        ),
        cause AS (
            SELECT w.*, d.rank AS cause_rank, d.enter_ns, d.prev_leave_ns, d.step, d.step_start_ns
            FROM waited w JOIN dcs d ON d.comm_id = w.comm_id AND d.seq = w.seq AND d.enter_ns = w.last_ns
            QUALIFY row_number() OVER (PARTITION BY w.comm_id, w.seq ORDER BY d.rank) = 1
        ),
        -- how much later the cause's step began than each waiter's, weighted by the wait
        late AS (
            SELECT c.comm_id, c.seq,
                   sum(d.wait_ns * (c.step_start_ns - d.step_start_ns)) / sum(d.wait_ns) AS late_start_ns
            FROM cause c JOIN dcs d ON d.comm_id = c.comm_id AND d.seq = c.seq AND d.wait_ns > 0
            GROUP BY c.comm_id, c.seq
        )
        SELECT c.cause_rank, c.wait_ns, c.waiting, c.step, c.enter_ns,
               greatest(coalesce(c.prev_leave_ns, c.step_start_ns), c.step_start_ns) AS from_ns,
               c.matched, len(m.members) AS group_size, coalesce(l.late_start_ns, 0) AS late_start_ns
        FROM cause c LEFT JOIN late l USING (comm_id, seq) LEFT JOIN communicators m USING (comm_id)
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


def device_waits(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Who made the accelerators wait (:func:`device_wait_instances`), per cause rank, largest
    first: the ``instances`` it was last in, the summed wait of the others (ms) and its
    ``share`` of all, the most ranks that waited, its steps, the stretches before its kernels
    (``before_ms``) split into ``busy_ms`` and ``idle_ms``, and the fewest ranks of its
    collectives' groups in the trace (``traced``) against the largest group (``group_size``):
    a trace of some ranks only cannot see a later rank it lacks; and how much later its host
    steps began than the waiters' (``late_start_ms``, weighted by the waits)."""
    inst = device_wait_instances(con)
    columns = ["cause_rank", "instances", "wait_ms", "waiting_ranks", "steps", "before_ms", "busy_ms",
               "idle_ms", "share", "traced", "group_size", "late_start_ms"]
    if inst.empty:
        return pd.DataFrame({c: [] for c in columns})
    inst = inst.rename(columns={"before_ns": "before", "busy_ns": "busy"})
    inst["late_weighted"] = inst["late_start_ns"] * inst["wait_ns"]
    total = inst["wait_ns"].sum()
    out = inst.groupby("cause_rank").agg(
        instances=("wait_ns", "size"), wait=("wait_ns", "sum"), waiting_ranks=("waiting", "max"),
        steps=("step", lambda s: sorted(set(int(x) for x in s))), before=("before", "sum"), busy=("busy", "sum"),
        traced=("matched", "min"), group_size=("group_size", "max"),
        late=("late_weighted", "sum"),
    ).reset_index()
    return pd.DataFrame({
        "cause_rank": out["cause_rank"].astype(int), "instances": out["instances"],
        "wait_ms": out["wait"] / 1e6, "waiting_ranks": out["waiting_ranks"], "steps": out["steps"],
        "before_ms": out["before"] / 1e6, "busy_ms": out["busy"] / 1e6,
        "idle_ms": (out["before"] - out["busy"]) / 1e6, "share": out["wait"] / total,
        "traced": out["traced"], "group_size": out["group_size"],
        "late_start_ms": out["late"] / out["wait"] / 1e6,
    }).sort_values(["wait_ms", "cause_rank"], ascending=[False, True], ignore_index=True)


def device_wait_steps(con: duckdb.DuckDBPyConnection, top: int = 5, bins: StepBins | None = None) -> pd.DataFrame:
    """step, cause ("rank N"; ranks past the ``top`` largest are "other ranks"), ms: the waiting
    in collective kernels per step, summed over the ranks that waited, by the rank whose kernel
    started last (with ``bins``, per mean step of each bin, as :func:`cause_steps`)."""
    inst = device_wait_instances(con)
    if inst.empty:
        return pd.DataFrame({"step": [], "cause": [], "ms": []})
    order = inst.groupby("cause_rank")["wait_ns"].sum().sort_values(ascending=False, kind="stable")
    keep = [f"rank {r}" for r in order.index[:top]]
    bins = bins or StepBins(0, 0, 1)
    step = inst["step"].to_numpy(np.int64)
    first = bins.first + (step - bins.first) // bins.per * bins.per
    width = np.minimum(bins.per, bins.last - first + 1) if bins.per > 1 else np.ones(len(step), np.int64)
    cause = [f"rank {r}" if f"rank {r}" in keep else "other ranks" for r in inst["cause_rank"]]
    df = pd.DataFrame({"step": first, "cause": cause, "ms": inst["wait_ns"].to_numpy() / 1e6 / width})
    out = df.groupby(["step", "cause"], as_index=False)["ms"].sum()
    levels = keep + (["other ranks"] if "other ranks" in set(out["cause"]) else [])
    out["cause"] = pd.Categorical(out["cause"], categories=levels)
    return out


def device_wait_lines(con: duckdb.DuckDBPyConnection, limit: int = 10) -> list[str]:
    """One sentence per cause rank of :func:`device_waits`, largest first."""
    out = []
    for r in device_waits(con).head(limit).itertuples():
        if r.idle_ms <= r.busy_ms:
            late = "its device was mostly busy: its kernels took longer"
        elif r.late_start_ms > 0:
            late = (f"its device was mostly idle: its host launched the kernels late, its steps having begun "
                    f"{ms(r.late_start_ms * 1e6)} after the waiting ranks' on average")
        else:
            late = ("its device was mostly idle: its host launched the kernels late, in steps that began no "
                    "later than the waiting ranks'")
        out.append(
            f"rank {r.cause_rank} started its collective kernels last {r.instances} time"
            f"{'s' if r.instances != 1 else ''} at {step_ranges(r.steps)}: the others waited "
            f"{ms(r.wait_ms * 1e6)} in theirs ({100 * r.share:.0f}% of all device waiting, up to "
            f"{r.waiting_ranks} rank{'s' if r.waiting_ranks != 1 else ''}); in the {ms(r.before_ms * 1e6)} before, "
            f"its device was busy {ms(r.busy_ms * 1e6)} and idle {ms(r.idle_ms * 1e6)} ({late})"
            + (f"; only {r.traced} of its group's {r.group_size} ranks are in the trace, so a rank not "
               "traced may have started later" if r.group_size > r.traced else ""))
    return out
