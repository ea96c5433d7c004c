"""``analyze diff A B``: what changed between two runs, or two sets of runs, per step.

Each side is a run directory, or a directory of runs (a sweep, or replications made by hand;
every successful run under it), or one configuration of a sweep, ``SWEEP@N`` (the runs whose
run.json names configuration N). For every item, the time per step, as the mean over ranks:

- ``phase``: the step and each phase of the phase model;
- ``region``: each region's exclusive time on the main threads (data loading, forward, a
  user region, an MPI function...);
- ``collective``: each operation's time in collectives (all locations; waiting included)
  and, as ``<op> wait``, its waiting time.

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


@dataclass
class Side:
    label: str
    runs: list[Path]


def _is_run(path: Path) -> bool:
    return path.is_file() and path.suffix == ".otf2" or path.is_dir() and any(path.glob("*.otf2"))


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


def per_step(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """kind, name, step, ms: every item's time per steady-state step, mean over ranks."""
    a, b = views.steady_steps(con)
    window = {"a": a, "b": b}
    df = con.execute("""
        WITH st AS (SELECT rank, step, start_ns, end_ns, duration_ns FROM steps WHERE step >= $a AND step < $b),
        ranks AS (SELECT step, count(*) AS n FROM st GROUP BY step),
        items AS (
            SELECT 'phase' AS kind, 'step' AS name, step, duration_ns AS ns FROM st
            UNION ALL
            SELECT 'phase', phase, step, duration_ns FROM phases WHERE step >= $a AND step < $b
            UNION ALL
            SELECT 'region', r.name, st.step, i.exclusive_ns
            FROM (SELECT i.* FROM intervals i JOIN locations l USING (location_id) WHERE l.is_main) i
            JOIN regions r USING (region_id)
            ASOF JOIN st ON i.rank = st.rank AND i.start_ns >= st.start_ns
            WHERE i.start_ns < st.end_ns
            UNION ALL
            SELECT 'collective', c.op, st.step, c.leave_ns - c.enter_ns
            FROM collectives c ASOF JOIN st ON c.rank = st.rank AND c.enter_ns >= st.start_ns
            WHERE c.enter_ns < st.end_ns
            UNION ALL
            SELECT 'collective', c.op || ' wait', st.step, c.wait_ns
            FROM collectives c ASOF JOIN st ON c.rank = st.rank AND c.enter_ns >= st.start_ns
            WHERE c.enter_ns < st.end_ns
        )
        SELECT kind, name, step, sum(ns) / 1e6 / any_value(ranks.n) AS ms
        FROM items JOIN ranks USING (step) GROUP BY kind, name, step
    """, window).df()
    # an item absent from a step took 0 ms there
    steps = pd.Index(range(a, b), name="step")
    full = (df.set_index(["kind", "name", "step"])["ms"].unstack("step").reindex(columns=steps)
            .fillna(0.0).stack().rename("ms").reset_index())
    return full


def _samples(s: Side, force: bool) -> tuple[pd.DataFrame, str]:
    """(kind, name, sample, ms) and what a sample is (steps of one run, or runs)."""
    parts = []
    for i, run in enumerate(s.runs):
        paths = database.build(run, force=force)
        with duckdb.connect(str(paths.db), read_only=True) as con:
            df = per_step(con)
        if len(s.runs) == 1:
            parts.append(df.rename(columns={"step": "sample"}))
        else:
            parts.append(df.groupby(["kind", "name"], as_index=False)["ms"].mean().assign(sample=i))
    return pd.concat(parts, ignore_index=True), "steps" if len(s.runs) == 1 else "runs"


def welch(a: np.ndarray, b: np.ndarray, confidence: float = scaling.CONFIDENCE) -> tuple[float, float, float]:
    """(mean(b) - mean(a), low, high): Welch's t interval; NaN bounds with fewer than two
    samples on a side."""
    d = float(b.mean() - a.mean())
    if len(a) < 2 or len(b) < 2:
        return d, np.nan, np.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se2 = va + vb
    if se2 == 0:
        return d, d, d
    dof = se2 ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = scaling.t_quantile(max(1, int(np.floor(dof))), confidence) * np.sqrt(se2)
    return d, d - half, d + half


def diff(a: str | Path, b: str | Path, *, force: bool = False) -> tuple[pd.DataFrame, Side, Side]:
    """The diff table (schema ``diff``) of B against A, largest change first."""
    sa, sb = side(a), side(b)
    xa, over_a = _samples(sa, force)
    xb, over_b = _samples(sb, force)
    over = over_a if over_a == over_b else "runs"
    rows = []
    for key in sorted(set(map(tuple, xa[["kind", "name"]].values)) | set(map(tuple, xb[["kind", "name"]].values))):
        va = _values(xa, key)
        vb = _values(xb, key)
        na, nb = len(va) or xa["sample"].nunique(), len(vb) or xb["sample"].nunique()
        va = va if len(va) else np.zeros(na)
        vb = vb if len(vb) else np.zeros(nb)
        d, lo, hi = welch(va, vb)
        ma = float(va.mean())
        rows.append({"kind": key[0], "name": key[1], "a_ms": ma, "b_ms": float(vb.mean()), "delta_ms": d,
                     "ci_low": lo, "ci_high": hi, "change_pct": 100 * d / ma if ma else np.nan,
                     "n_a": len(va), "n_b": len(vb), "over": over,
                     "significant": bool(lo > 0 or hi < 0) if not np.isnan(lo) else None})
    df = pd.DataFrame(rows, columns=DIFF.names)
    order = df["delta_ms"].abs().sort_values(ascending=False, kind="stable").index
    return df.loc[order].reset_index(drop=True), sa, sb


def _values(x: pd.DataFrame, key: tuple[str, str]) -> np.ndarray:
    return x.loc[(x["kind"] == key[0]) & (x["name"] == key[1]), "ms"].to_numpy(float)


def text(df: pd.DataFrame, a: Side, b: Side, top: int = 15) -> str:
    """The largest changes as a table, with what A and B are."""
    shown = df[df["delta_ms"].abs() > 0].head(top).copy()
    for col in ("a_ms", "b_ms", "delta_ms", "ci_low", "ci_high"):
        shown[col] = shown[col].round(3)
    shown["change_pct"] = shown["change_pct"].round(1)
    over = df["over"].iloc[0] if len(df) else "steps"
    head = (f"A: {a.label} ({len(a.runs)} run{'s' if len(a.runs) != 1 else ''})   "
            f"B: {b.label} ({len(b.runs)} run{'s' if len(b.runs) != 1 else ''})\n"
            f"change in time per step (mean over ranks), B - A, with 95% confidence intervals over {over}; "
            f"largest first")
    cols = ["kind", "name", "a_ms", "b_ms", "delta_ms", "ci_low", "ci_high", "change_pct"]
    return head + "\n" + shown[cols].to_string(index=False, na_rep="-")
