"""What the CLI prints and the report pages draw from the cause tables (read-only queries).

Sentences and small tables for ``analyze causes / overlap / critical-path``, and the frames
the figures of :mod:`reports.causes` are drawn from (times in milliseconds).
"""

from __future__ import annotations

import duckdb
import pandas as pd

from analyze.schema import CauseKind, DevicePhase
from analyze.tables.causes.critical_path import who_is_on
from analyze.tables.causes.device import (
    DEVICE_QUEUE,
    LATE_START,
    REGION,
    device_paths,
    device_wait_causes,
    device_waits,
)
from analyze.tables.names import short_name
from analyze.tables.steps import RankGroups, StepBins, rank_group_sql, top_and_rest


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


def device_path_summary(con: duckdb.DuckDBPyConnection, limit: int | None = None,
                        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The accelerators' critical path (:func:`.device.device_paths`): per step its length,
    the ranks it runs on in time order ("3 -> 0") and the rank with the most time on it; and
    per rank its time on the paths of all steps, largest first. With ``limit``, only the
    ``limit`` steps whose path leaves the rank that ended them for longest (in step order).
    Both empty without waits in collective kernels."""
    chain = device_paths(con)
    if chain.empty:
        return (pd.DataFrame(columns=["step", "path_ms", "path_ranks", "path", "critical_rank", "critical_ms"]),
                pd.DataFrame(columns=["rank", "path_ms", "path%"]))
    who = who_is_on(chain)
    steps = chain.groupby("step").agg(start=("start_ns", "min"), end=("end_ns", "max"), path=("rank", _hops))
    last = chain.groupby("step").last()  # the stretch on the rank that ended the step
    away = last["start_ns"] - steps["start"]  # the path's time on the ranks before it
    per_step = pd.DataFrame({
        "step": steps.index.astype(int), "path_ms": ((steps["end"] - steps["start"]) / 1e6).round(3).to_numpy(),
        "path_ranks": who["path_ranks"].to_numpy(), "path": steps["path"].to_numpy(),
        "critical_rank": who["critical_rank"].astype(int).to_numpy(),
        "critical_ms": (who["critical_ns"] / 1e6).round(3).to_numpy(), "away": away.to_numpy()})
    if limit is not None and len(per_step) > limit:
        per_step = per_step.sort_values(["away", "step"], ascending=[False, True]).head(limit).sort_values("step")
    per_rank = chain.groupby("rank", as_index=False)["duration_ns"].sum()
    per_rank = per_rank.sort_values(["duration_ns", "rank"], ascending=[False, True], ignore_index=True)
    total = per_rank["duration_ns"].sum()
    return (per_step.drop(columns="away").reset_index(drop=True),
            pd.DataFrame({"rank": per_rank["rank"].astype(int), "path_ms": (per_rank["duration_ns"] / 1e6).round(3),
                          "path%": (100.0 * per_rank["duration_ns"] / total).round(1) if total else 0.0}))


def _hops(ranks: pd.Series) -> str:
    """A path's ranks in time order, each once per visit: "3 -> 0"."""
    seen = [int(r) for r in ranks]
    return " -> ".join(str(r) for i, r in enumerate(seen) if i == 0 or r != seen[i - 1])


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
    df = (bins or StepBins(0, 0, 1)).sums(con, "delays", ["cause_rank", "cause_kind", "cause_region"], "idle_ns")
    if df.empty:
        return pd.DataFrame({"step": [], "cause": [], "ms": []})
    labels = [cause_label(r, k, g) for r, k, g in zip(df["cause_rank"], df["cause_kind"], df["cause_region"],
                                                      strict=True)]
    return top_and_rest(df, labels, keep, "other causes")


def path_steps(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(step, rank, ms: time on the critical path per step and rank; step, path_ms,
    balanced_ms, n: the path's length and the perfect-balance step time, over n steps). With
    ``bins``, per mean step of each bin, n its steps."""
    bins = bins or StepBins(0, 0, 1)
    width = bins.width("b")
    steps = con.execute(f"""SELECT b AS step, sum(duration_ns) / 1e6 / {width} AS path_ms,
                                   sum(balanced_ns) / 1e6 / {width} AS balanced_ms, {width} AS n
                            FROM (SELECT {bins.start()} AS b, duration_ns, balanced_ns FROM step_balance)
                            GROUP BY b ORDER BY step""").df()
    return _path_per_rank(con, "critical_path", bins), steps


def device_path_steps(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None,
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`path_steps` of the accelerators' critical path (:func:`.device.device_paths`):
    (step, rank, ms; step, path_ms, n), no perfect-balance time. Empty without waits in
    collective kernels."""
    bins = bins or StepBins(0, 0, 1)
    chain = device_paths(con)
    if chain.empty:
        return pd.DataFrame(columns=["step", "rank", "ms"]), pd.DataFrame(columns=["step", "path_ms", "n"])
    width = bins.width("b")
    con.register("device_path_rows", chain[["step", "rank", "duration_ns"]])
    try:
        steps = con.execute(f"""SELECT b AS step, sum(duration_ns) / 1e6 / {width} AS path_ms, {width} AS n
                                FROM (SELECT {bins.start()} AS b, duration_ns FROM device_path_rows)
                                GROUP BY b ORDER BY step""").df()  # (a path's stretches touch end to end)
        return _path_per_rank(con, "device_path_rows", bins), steps
    finally:
        con.unregister("device_path_rows")


def _path_per_rank(con: duckdb.DuckDBPyConnection, source: str, bins: StepBins) -> pd.DataFrame:
    """step, rank, ms: the time on the path of ``source`` (critical_path rows) per step (or bin)
    and rank."""
    return con.execute(f"""SELECT b AS step, rank, sum(duration_ns) / 1e6 / {bins.width('b')} AS ms
                           FROM (SELECT {bins.start()} AS b, rank, duration_ns FROM {source})
                           GROUP BY b, rank ORDER BY step, rank""").df()


def _part(kind: str, region: str) -> str:
    if kind == LATE_START:
        return "its host step began later"
    if kind == REGION:
        return f"its host spent longer in {short_name(region, 60)}"
    if kind == DEVICE_QUEUE:
        return "its kernels queued longer on its device"
    return "launches not in the trace"


def device_wait_lines(con: duckdb.DuckDBPyConnection, limit: int = 10, parts: int = 2,
                      inst: pd.DataFrame | None = None) -> list[str]:
    """One sentence per cause rank of :func:`device_waits` (over ``inst``, if already
    computed), largest first, with the ``parts`` largest reasons of :func:`device_wait_causes`."""
    why = device_wait_causes(con)
    out = []
    for r in device_waits(con, inst).head(limit).itertuples():
        mine = why[why["cause_rank"] == r.cause_rank].head(parts)
        reasons = " and ".join(f"{_part(k, g)} ({ms(v * 1e6)} of it)"
                               for k, g, v in zip(mine["kind"], mine["region"], mine["ms"], strict=True))
        out.append(
            f"rank {r.cause_rank} started its collective kernels last {r.instances} time"
            f"{'s' if r.instances != 1 else ''} at {step_ranges(r.steps)}: the others waited "
            f"{ms(r.wait_ms * 1e6)} in theirs ({100 * r.share:.0f}% of all device waiting, up to "
            f"{r.waiting_ranks} rank{'s' if r.waiting_ranks != 1 else ''})"
            + (f", because {reasons}" if reasons else "")
            + f"; in the {ms(r.before_ms * 1e6)} before its kernels, its device was busy {ms(r.busy_ms * 1e6)} "
            f"and idle {ms(r.idle_ms * 1e6)}"
            + (f"; only {r.traced} of its group's {r.group_size} ranks are in the trace, so a rank not "
               "traced may have started later" if r.group_size > r.traced else ""))
    return out
