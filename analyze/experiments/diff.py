"""``analyze diff A B``: what changed between two runs, or two sets of runs, per step.

Each side is a run directory, or a directory of runs (a sweep, or replications made by hand;
every successful run under it), or one configuration of a sweep, ``SWEEP@N`` (the runs whose
run.json names configuration N). For every item, the time per step, as the mean over ranks:

- ``phase``: the step and each phase of the phase model;
- ``region``: each region's exclusive time on the main threads (data loading, forward, a
  user region, an MPI function...);
- ``collective``: each operation's time in collectives (all locations; waiting included)
  and, as ``<op> wait``, its waiting time;
- on runs with accelerator streams (Kineto traces): ``device``, each device phase (compute,
  comm_hidden, comm_exposed, memory, idle: ``device_phases``), and ``kernel``, each kernel,
  copy or set by name (exclusive time on the streams, in the step the activity starts in).

Over the steady-state steps (warm-up excluded as in ``analyze phases``' breakdown). With one
run per side, the samples are the steps of each run; with several, each run's mean over its
steps, so the interval is over replications. The change B - A gets Welch's t interval
(unequal variances, Welch-Satterthwaite degrees of freedom, the t quantile of
:mod:`analyze.experiments.scaling`); rows are sorted by the size of the change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from analyze import views
from analyze.errors import AnalyzeError
from analyze.experiments import compare, scaling
from analyze.schema import DIFF
from analyze.tables import database
from analyze.tables.names import short_names


@dataclass
class Side:
    label: str
    runs: list[Path]


def _is_run(path: Path) -> bool:
    """A trace ``analyze phases`` reads: an OTF2 archive, or Kineto / Chrome trace JSON."""
    try:
        database.resolve(path)
    except AnalyzeError:
        return False
    return True


def side(spec: str | Path) -> Side:
    """A run, a directory of runs, or ``SWEEP@N`` (configuration N of a sweep)."""
    text = str(spec)
    path, config = Path(text), None
    if not path.exists() and "@" in text:
        base, _, number = text.rpartition("@")
        if not number.isdigit():
            raise AnalyzeError(f"{text}: after @ give a configuration number, e.g. {base}@1")
        path, config = Path(base), int(number)
    if not path.exists():
        raise AnalyzeError(f"no such run or directory: {path}")
    if config is None and _is_run(path):
        return Side(path.name if path.is_dir() else path.parent.name, [path])
    runs = []
    for run in compare.find_runs(path):
        info = json.loads((run / "run.json").read_text(encoding="utf-8"))
        if info.get("status") != "ok" or not _is_run(run):
            continue
        if config is not None and (info.get("sweep") or {}).get("config") != config:
            continue
        runs.append(run)
    if not runs:
        what = f"configuration {config} of {path}" if config is not None else str(path)
        raise AnalyzeError(f"{what} has no successful traced run to compare")
    return Side(f"{path.name}@{config}" if config is not None else path.name, runs)


ACCELERATOR = "accelerator_stream"  # locations.kind of device streams
CHUNK_INTERVALS = 2_000_000  # about this many main-thread intervals per statement: bounded memory


def item_stats(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """kind, name, mean, var, n: every item's time per steady-state step (mean over ranks),
    its mean and sample variance over the n steady steps; a step without the item counts as
    0 ms. Summed in SQL a few steps at a time (about :data:`CHUNK_INTERVALS` intervals a
    statement; DuckDB's ASOF join does not spill), so neither DuckDB nor pandas holds a
    long run's every step."""
    a, b = views.steady_steps(con)
    n = max(b - a, 0)
    ((total, device),) = con.execute(f"""
        SELECT count(*) FILTER (WHERE l.is_main OR l.kind = '{ACCELERATOR}'),
               count(*) FILTER (WHERE l.kind = '{ACCELERATOR}')
        FROM intervals i JOIN locations l USING (location_id)""").fetchall()
    per = max(1, n * CHUNK_INTERVALS // max(1, int(total)))
    acc = pd.DataFrame({"kind": [], "name": [], "c": [], "mu": [], "m2": []})
    for lo in range(a, b, per):
        acc = _combine(acc, _chunk_stats(con, lo, min(b, lo + per), device > 0))
    c = acc["c"].to_numpy(float)
    mu = acc["mu"].to_numpy(float)
    # the steps without the item are n - c zeros: merged with the c steps that have it
    m2 = acc["m2"].to_numpy(float) + mu ** 2 * c * (n - c) / max(n, 1)
    return pd.DataFrame({"kind": acc["kind"], "name": acc["name"], "mean": mu * c / max(n, 1),
                         "var": m2 / (n - 1) if n > 1 else np.nan, "n": n})


def _combine(x: pd.DataFrame, y: pd.DataFrame) -> pd.DataFrame:
    """Count, mean and sum of squared deviations of two sets of steps as one (Chan et al.'s
    pairwise update), per kind and name."""
    m = x.merge(y, on=["kind", "name"], how="outer", suffixes=("_x", "_y")).fillna(
        {"c_x": 0, "mu_x": 0.0, "m2_x": 0.0, "c_y": 0, "mu_y": 0.0, "m2_y": 0.0})
    c = m["c_x"] + m["c_y"]
    delta = m["mu_y"] - m["mu_x"]
    return pd.DataFrame({"kind": m["kind"], "name": m["name"], "c": c,
                         "mu": m["mu_x"] + delta * m["c_y"] / c,
                         "m2": m["m2_x"] + m["m2_y"] + delta ** 2 * m["c_x"] * m["c_y"] / c})


# the device's items, on runs with accelerator streams
_DEVICE_ITEMS = f"""
            UNION ALL
            SELECT 'device', phase, step, duration_ns FROM device_phases WHERE step >= $a AND step < $b
            UNION ALL
            SELECT 'kernel', r.name, st.step, i.exclusive_ns
            FROM (SELECT i.* FROM intervals i JOIN locations l USING (location_id)
                  WHERE l.kind = '{ACCELERATOR}' AND i.start_ns >= $t0 AND i.start_ns < $t1) i
            JOIN regions r USING (region_id)
            ASOF JOIN st ON i.rank = st.rank AND i.start_ns >= st.start_ns
            WHERE i.start_ns < st.end_ns"""


def _chunk_stats(con: duckdb.DuckDBPyConnection, a: int, b: int, device: bool = False) -> pd.DataFrame:
    """kind, name, c, mu, m2 over steps a..b-1 that have the item: how many, the mean time per
    step and the sum of squared deviations (``device``: with the device's items)."""
    ((t0, t1),) = con.execute("SELECT min(start_ns), max(end_ns) FROM steps WHERE step >= $a AND step < $b",
                              {"a": a, "b": b}).fetchall()
    if t0 is None:
        return pd.DataFrame({"kind": [], "name": [], "c": [], "mu": [], "m2": []})
    return con.execute(f"""
        WITH st AS (SELECT rank, step, start_ns, end_ns, duration_ns FROM steps WHERE step >= $a AND step < $b),
        ranks AS (SELECT step, count(*) AS n FROM st GROUP BY step),
        items AS (
            SELECT 'phase' AS kind, 'step' AS name, step, duration_ns AS ns FROM st
            UNION ALL
            SELECT 'phase', phase, step, duration_ns FROM phases WHERE step >= $a AND step < $b
            UNION ALL
            SELECT 'region', r.name, st.step, i.exclusive_ns
            FROM (SELECT i.* FROM intervals i JOIN locations l USING (location_id)
                  WHERE l.is_main AND i.start_ns >= $t0 AND i.start_ns < $t1) i
            JOIN regions r USING (region_id)
            ASOF JOIN st ON i.rank = st.rank AND i.start_ns >= st.start_ns
            WHERE i.start_ns < st.end_ns
            UNION ALL
            -- a kernel whose operation neither args nor name say (op NULL) is 'other', as in overlap
            SELECT 'collective', coalesce(c.op, 'other'), st.step, c.leave_ns - c.enter_ns
            FROM (SELECT * FROM collectives WHERE enter_ns >= $t0 AND enter_ns < $t1) c
            ASOF JOIN st ON c.rank = st.rank AND c.enter_ns >= st.start_ns
            WHERE c.enter_ns < st.end_ns
            UNION ALL
            SELECT 'collective', coalesce(c.op, 'other') || ' wait', st.step, c.wait_ns
            FROM (SELECT * FROM collectives WHERE enter_ns >= $t0 AND enter_ns < $t1) c
            ASOF JOIN st ON c.rank = st.rank AND c.enter_ns >= st.start_ns
            WHERE c.enter_ns < st.end_ns
            {_DEVICE_ITEMS if device else ""}
        ),
        per_step AS (
            SELECT kind, name, step, sum(ns) / 1e6 / any_value(ranks.n) AS ms
            FROM items JOIN ranks USING (step) GROUP BY kind, name, step
        )
        SELECT kind, name, count(*) AS c, avg(ms) AS mu, coalesce(var_samp(ms), 0) * (count(*) - 1) AS m2
        FROM per_step GROUP BY kind, name
    """, {"a": a, "b": b, "t0": t0, "t1": t1}).df()


def _samples(s: Side, force: bool) -> tuple[pd.DataFrame, str]:
    """(kind, name, mean, var, n) over the side's samples, and what a sample is (the steps of
    its one run, or its runs: each run's mean per step, 0 where the run lacks the item)."""
    parts = []
    for run in s.runs:
        paths = database.build(run, force=force)
        with duckdb.connect(str(paths.db), read_only=True, config=database.read_config()) as con:
            parts.append(item_stats(con))
    if len(s.runs) == 1:
        return parts[0], "steps"
    means = pd.concat([p.set_index(["kind", "name"])["mean"] for p in parts], axis=1).fillna(0.0)
    runs = means.to_numpy(float)
    out = pd.DataFrame({"mean": runs.mean(axis=1), "var": runs.var(axis=1, ddof=1), "n": len(parts)},
                       index=means.index)
    return out.reset_index(), "runs"


def welch(a: np.ndarray, b: np.ndarray, confidence: float = scaling.CONFIDENCE) -> tuple[float, float, float]:
    """(mean(b) - mean(a), low, high): Welch's t interval; NaN bounds with fewer than two
    samples on a side."""
    return welch_stats(float(a.mean()), float(a.var(ddof=1)) if len(a) > 1 else np.nan, len(a),
                       float(b.mean()), float(b.var(ddof=1)) if len(b) > 1 else np.nan, len(b), confidence)


def welch_stats(ma: float, va: float, na: int, mb: float, vb: float, nb: int,
                confidence: float = scaling.CONFIDENCE) -> tuple[float, float, float]:
    """:func:`welch` from each side's mean, sample variance and number of samples."""
    d = mb - ma
    if na < 2 or nb < 2:
        return d, np.nan, np.nan
    va, vb = va / na, vb / nb
    se2 = va + vb
    if se2 == 0:
        return d, d, d
    dof = se2 ** 2 / (va ** 2 / (na - 1) + vb ** 2 / (nb - 1))
    # Welch-Satterthwaite's dof is a whole number for equal variances and counts; the sums'
    # rounding (DuckDB adds in whatever order its threads finish) must not floor 12 to 11
    half = scaling.t_quantile(max(1, int(np.floor(dof + 1e-9))), confidence) * np.sqrt(se2)
    return d, d - half, d + half


def diff(a: str | Path, b: str | Path, *, force: bool = False) -> tuple[pd.DataFrame, Side, Side]:
    """The diff table (schema ``diff``) of B against A, largest change first."""
    sa, sb = side(a), side(b)
    xa, over_a = _samples(sa, force)
    xb, over_b = _samples(sb, force)
    over = over_a if over_a == over_b else "runs"
    both = xa.merge(xb, on=["kind", "name"], how="outer", suffixes=("_a", "_b")).sort_values(["kind", "name"])
    rows = []
    for r in both.itertuples(index=False):
        # an item one side never had: zero in each of its samples
        ma, va, na = (r.mean_a, r.var_a, int(r.n_a)) if pd.notna(r.n_a) else (0.0, 0.0, _count(xa, sa))
        mb, vb, nb = (r.mean_b, r.var_b, int(r.n_b)) if pd.notna(r.n_b) else (0.0, 0.0, _count(xb, sb))
        d, lo, hi = welch_stats(float(ma), float(va), na, float(mb), float(vb), nb)
        rows.append({"kind": r.kind, "name": r.name, "a_ms": float(ma), "b_ms": float(mb), "delta_ms": d,
                     "ci_low": lo, "ci_high": hi, "change_pct": 100 * d / ma if ma else np.nan,
                     "n_a": na, "n_b": nb, "over": over,
                     "significant": bool(lo > 0 or hi < 0) if not np.isnan(lo) else None})
    df = pd.DataFrame(rows, columns=DIFF.names)
    order = df["delta_ms"].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True), sa, sb


def _count(x: pd.DataFrame, s: Side) -> int:
    """How many samples the side has (steps of its run, or runs)."""
    return int(x["n"].iloc[0]) if len(x) else len(s.runs)


def text(df: pd.DataFrame, a: Side, b: Side, top: int = 15) -> str:
    """The largest changes as a table, with what A and B are."""
    shown = df[df["delta_ms"].abs() > 0].head(top).copy()
    for col in ("a_ms", "b_ms", "delta_ms", "ci_low", "ci_high"):
        shown[col] = shown[col].round(3)
    shown["change_pct"] = shown["change_pct"].round(1)
    shown["name"] = short_names(list(shown["name"]))
    over = df["over"].iloc[0] if len(df) else "steps"
    head = (f"A: {a.label} ({len(a.runs)} run{'s' if len(a.runs) != 1 else ''})   "
            f"B: {b.label} ({len(b.runs)} run{'s' if len(b.runs) != 1 else ''})\n"
            f"change in time per step (mean over ranks), B - A, with 95% confidence intervals over {over}; "
            f"largest first")
    cols = ["kind", "name", "a_ms", "b_ms", "delta_ms", "ci_low", "ci_high", "change_pct"]
    if shown.empty:
        return head + f"\nno change: all {len(df)} items took the same time per step in A and B"
    return head + "\n" + shown[cols].to_string(index=False, na_rep="-")
