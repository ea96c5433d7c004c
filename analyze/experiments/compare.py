"""``analyze compare SWEEP``: one table across the runs of a sweep, and the models built on it.

Each run's database is built or reused as ``analyze phases`` does; from it come the run's
steady-state step time, phases and allreduce calls. The runs' factor levels come from their
``run.json`` (``factors``, written by ``instrument sweep``); for runs made by hand, the
framework, the rank count and the script parameters that differ between runs are the factors.
Everything is written to ``SWEEP/compare.duckdb`` (tables in docs/schema.md) and returned as
a :class:`Comparison` for the report. The statistics are in :mod:`analyze.experiments.scaling`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze import views
from analyze.errors import AnalyzeError
from analyze.experiments import energy, scaling
from analyze.schema import (
    ALLREDUCE_MODEL,
    COMPARISON,
    ENERGY_RUNS,
    FITS,
    PREDICTIONS,
    SWEEP_ENERGY_TABLES,
    SWEEP_TABLES,
    VARIATION,
)
from analyze.tables import database

DB_NAME = "compare.duckdb"
SWEEP_JSON = "sweep.json"
SCALE_FACTORS = ("ranks", "nodes")
PHASE_COLUMNS = {"compute": "compute_ms", "allreduce": "allreduce_ms", "other_comm": "other_comm_ms",
                 "idle": "idle_ms", "other": "other_ms"}
RESPONSES = ("step_ms", "throughput_sps")  # whose variation is allocated to the factors
FIT_RESPONSES = ("step_ms", "comm_ms")


@dataclass
class Comparison:
    directory: Path
    db: Path
    factors: list[str]  # in design order; the scale factor (ranks or nodes) among them
    runs: pd.DataFrame  # the comparison table, one column per factor added
    configs: pd.DataFrame  # the configurations table, one column per factor added
    speedups: pd.DataFrame
    variation: pd.DataFrame
    fits: pd.DataFrame
    curves: pd.DataFrame  # response, group_label, model, ranks, value: the fits drawn as lines
    allreduce_points: pd.DataFrame
    allreduce_model: pd.DataFrame
    predictions: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    energy_runs: pd.DataFrame = field(default_factory=energy.empty_runs)  # runs with power
    energy_configs: pd.DataFrame = field(default_factory=pd.DataFrame)  # EDP, normalized

    @property
    def others(self) -> list[str]:
        """The factors other than the rank count: what a scaling curve is drawn per."""
        return [f for f in self.factors if f not in SCALE_FACTORS]


def _sweep_meta(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / SWEEP_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def find_runs(directory: Path) -> list[Path]:
    """Run directories (with a run.json) directly under ``directory``, in name order."""
    if not directory.is_dir():
        raise AnalyzeError(f"no such sweep directory: {directory}")
    runs = sorted(p for p in directory.iterdir() if (p / "run.json").is_file())
    if not runs:
        raise AnalyzeError(f"{directory} holds no runs (no subdirectory with a run.json); give the "
                           "directory instrument sweep wrote, e.g. traces/sweeps/NAME.")
    return runs


def run_metrics(con: duckdb.DuckDBPyConnection, ranks: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """Steady-state means of one run's database and its allreduce calls per message size."""
    per_phase = views.breakdown(con).set_index("phase")["ms"]
    row: dict[str, Any] = {col: float(per_phase.get(ph, 0.0)) for ph, col in PHASE_COLUMNS.items()}
    row["step_ms"] = float(per_phase.sum())
    row["comm_ms"] = row["allreduce_ms"] + row["other_comm_ms"]
    a, b = views.steady_steps(con)
    row["steps"] = b - a
    sizes = con.execute("""
        WITH st AS (SELECT rank, start_ns, end_ns FROM steps WHERE step >= $a AND step < $b)
        SELECT c.bytes, count(*) AS calls, avg(c.transfer_ns) / 1e6 AS transfer_ms,
               avg(c.wait_ns) / 1e6 AS wait_ms
        FROM collectives c JOIN st ON c.rank = st.rank AND c.enter_ns >= st.start_ns
                                  AND c.enter_ns < st.end_ns
        WHERE c.op = 'allreduce' GROUP BY c.bytes ORDER BY c.bytes
    """, {"a": a, "b": b}).df()
    rank_steps = int(con.execute("SELECT count(*) FROM steps WHERE step >= $a AND step < $b",
                                 {"a": a, "b": b}).fetchone()[0])  # type: ignore[index]
    sizes["calls_per_step"] = sizes["calls"] / rank_steps if rank_steps else np.nan
    sizes["ranks"] = ranks
    row["allreduce_calls"] = float(sizes["calls_per_step"].sum())
    row["allreduce_bytes"] = float((sizes["calls_per_step"] * sizes["bytes"]).sum())
    row["allreduce_transfer_ms"] = float((sizes["calls_per_step"] * sizes["transfer_ms"]).sum())
    return row, sizes


def _factor_levels(infos: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Factor names in design order and each run's levels."""
    if meta.get("factors"):
        names = [f["name"] for f in meta["factors"]]
        return names, [dict(i.get("factors", {})) for i in infos]
    if any("factors" in i for i in infos):
        names = list(dict.fromkeys(k for i in infos for k in i.get("factors", {})))
        return names, [dict(i.get("factors", {})) for i in infos]
    # runs made by hand: what differs between the successful ones
    levels = [{"framework": i.get("framework"), "ranks": i.get("ranks"), **i.get("params", {})} for i in infos]
    ok = [lv for lv, i in zip(levels, infos, strict=True) if i.get("status") == "ok"] or levels
    keys = list(dict.fromkeys(k for lv in ok for k in lv))
    names = [k for k in keys if len({json.dumps(lv.get(k), default=str) for lv in ok}) > 1]
    return names, [{k: lv.get(k) for k in names} for lv in levels]


def _label(levels: dict[str, Any], names: list[str]) -> str:
    return ", ".join(f"{k}={levels.get(k)}" for k in names)


def collect(directory: Path, force: bool = False) -> tuple[list[str], pd.DataFrame, pd.DataFrame, list[str]]:
    """(factors, runs table, allreduce points, notes): every run's metrics."""
    meta = _sweep_meta(directory)
    run_dirs = find_runs(directory)
    infos = [json.loads((d / "run.json").read_text(encoding="utf-8")) for d in run_dirs]
    names, levels = _factor_levels(infos, meta)
    configs: dict[str, int] = {}
    rows, points, notes = [], [], []
    for run_dir, info, lv in zip(run_dirs, infos, levels, strict=True):
        label = _label(lv, names)
        sweep = info.get("sweep", {})
        config = sweep.get("config") or configs.setdefault(label, len(configs) + 1)
        params = info.get("params", {})
        ranks = int(info.get("ranks") or 1)
        batch = params.get("batch_size")
        row: dict[str, Any] = {
            "run_name": run_dir.name, "config": config, "config_label": label,
            "replication": sweep.get("replication"), "run_order": sweep.get("order"),
            "factors": lv, "status": info.get("status") or "incomplete",
            "framework": info.get("framework"), "ranks": ranks, "path": str(run_dir),
            "samples_per_step": ranks * batch * int(params.get("accumulate", 1))
            if isinstance(batch, int) else None,
        }
        if row["status"] == "ok" and not any(run_dir.glob("*.otf2")):
            row["status"] = "no_trace"  # e.g. --tracer none
        if row["status"] == "ok":
            try:
                paths = database.build(run_dir, force=force)
                with duckdb.connect(str(paths.db), read_only=True) as con:
                    metrics, sizes = run_metrics(con, ranks)
                    metrics.update(energy.run_energy(con, row["samples_per_step"]) or {})
                row.update(metrics)
                points.append(sizes.assign(run_name=run_dir.name, config=config))
            except AnalyzeError as e:
                row["status"] = "unreadable"
                notes.append(f"{run_dir.name}: {e}")
        rows.append(row)
    runs = pd.DataFrame(rows)
    for col in COMPARISON.names:
        if col not in runs:
            runs[col] = np.nan
    runs["throughput_sps"] = runs["samples_per_step"] / (runs["step_ms"] / 1000)
    if runs["samples_per_step"].isna().all():
        notes.append("no run passes --batch-size, so there is no throughput, speedup or efficiency")
    not_ok = runs[runs["status"] != "ok"]
    if len(not_ok):
        notes.append(f"{len(not_ok)} of {len(runs)} runs left out ({', '.join(sorted(set(not_ok['status'])))}): "
                     + ", ".join(not_ok["run_name"].head(5)) + (", ..." if len(not_ok) > 5 else ""))
    missing = [p["name"] for p in meta.get("plan", []) if p["name"] not in set(runs["run_name"])]
    if missing:
        notes.append(f"{len(missing)} planned runs have not run yet (resume the sweep): {', '.join(missing[:3])}"
                     + (", ..." if len(missing) > 3 else ""))
    cols = ["run_name", "config", "ranks", "bytes", "calls_per_step", "transfer_ms", "wait_ms"]
    pts = pd.concat(points, ignore_index=True)[cols] if points else pd.DataFrame(columns=cols)
    pts.insert(4, "ring_bytes", scaling.ring_bytes(pts["bytes"], pts["ranks"]))
    return [factor_column(n) for n in names], _widen(runs, names, meta), pts, notes


def factor_column(name: str) -> str:
    """The column a factor gets: its name, unless the table has a column of that name."""
    reserved = set(COMPARISON.names) - {"ranks"}
    return f"{name}_factor" if name in reserved else name


def _widen(df: pd.DataFrame, names: list[str], meta: dict[str, Any]) -> pd.DataFrame:
    """One column per factor (after the table's own columns), levels ordered as designed."""
    out = df.copy()
    order = {f["name"]: f["levels"] for f in meta.get("factors", [])}
    for name in names:
        values = [lv.get(name) for lv in df["factors"]]
        if name == "ranks":  # the measured rank count (a sweep's ranks factor says the same)
            continue
        levels = order.get(name) or sorted({v for v in values if v is not None}, key=_sort_key)
        out[factor_column(name)] = pd.Categorical(values, categories=list(dict.fromkeys(levels)),
                                                  ordered=True)
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    return (0, v) if isinstance(v, int | float) and not isinstance(v, bool) else (1, str(v))


def compare(directory: Path | str, *, force: bool = False, predict_ranks: list[int] | None = None,
            db: Path | str | None = None, baseline: dict[str, Any] | None = None) -> Comparison:
    """Compare the runs under ``directory``; write and return the tables (see the module doc).
    ``baseline`` (factor -> level) is what EDP is normalized to (default: the fewest ranks)."""
    directory = Path(directory)
    factors, runs, points, notes = collect(directory, force)
    meta = _sweep_meta(directory)
    ok = runs[runs["status"] == "ok"].copy()
    if ok.empty:
        raise AnalyzeError(f"no run in {directory} finished with a readable trace; see the runs' "
                           "output.log (instrument sweep writes one per run).")
    cols = [c for c in factors if c in ok.columns]
    ok = ok.sort_values([*cols, "run_name"])  # design order everywhere below
    others = [f for f in factors if f not in SCALE_FACTORS]
    configs = scaling.summarize(
        ok, ["config", "config_label"], ["step_ms", "throughput_sps", "comm_ms", "compute_ms",
                                         "idle_ms", "other_ms", "allreduce_ms", "other_comm_ms",
                                         "allreduce_transfer_ms"])
    first = ok.drop_duplicates("config").set_index("config")
    configs["ranks"] = configs["config"].map(first["ranks"])
    configs["factors"] = configs["config"].map(first["factors"])
    for c in cols:
        configs[c] = configs["config"].map(first[c]) if c != "ranks" else configs["ranks"]
        if c != "ranks":
            configs[c] = pd.Categorical(configs[c], categories=ok[c].cat.categories, ordered=True)
    configs = configs.sort_values(cols or ["config"]).reset_index(drop=True)
    speedups = _speedups(configs, cols, meta.get("baselines", {}), notes)
    main = speedups[speedups["baseline"] == "ranks"].set_index("config")
    configs["speedup"] = configs["config"].map(main["speedup"])
    configs["efficiency"] = configs["config"].map(main["efficiency"])
    configs["baseline_config"] = configs["config"].map(main["baseline_config"])
    variation = _variation(ok, cols, notes)
    fits, curves, step_predictions = _fits(ok, others, notes)
    model, predictions = _allreduce(points, ok, others, predict_ranks or [], notes)
    if len(step_predictions):
        predictions = pd.concat([predictions, step_predictions], ignore_index=True)
    energy_runs, energy_configs = _energy(ok, cols, baseline, notes)
    out = Path(db) if db else directory / DB_NAME
    result = Comparison(directory, out, factors, runs, configs, speedups, variation, fits, curves,
                        points, model, predictions, notes, energy_runs, energy_configs)
    write(result)
    return result


def _energy(ok: pd.DataFrame, cols: list[str], baseline: dict[str, Any] | None,
            notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """energy_runs and energy_configurations from the runs that have power."""
    if "energy_j" not in ok or ok["energy_j"].isna().all():
        return energy.empty_runs(), pd.DataFrame()
    with_power = ok[ok["energy_j"].notna()]
    if len(with_power) < len(ok):
        notes.append(f"{len(ok) - len(with_power)} of {len(ok)} runs have no power samples; energy and EDP "
                     "are over the others (analyze energy RUN says why)")
    unknown = [k for k in (baseline or {}) if k not in with_power]
    if unknown:
        raise AnalyzeError(f"--baseline names {', '.join(unknown)}, which is not a factor of this sweep "
                           f"(factors: {', '.join(cols) or 'none'})")
    configs = energy.configurations(with_power, cols, baseline)
    if baseline and configs["baseline_config"].isna().all():
        notes.append(f"EDP baseline {configs['baseline'].iloc[0]} was not measured (with power)")
    return with_power.reindex(columns=ENERGY_RUNS.names), configs


def _speedups(configs: pd.DataFrame, cols: list[str], baselines: dict[str, Any],
              notes: list[str]) -> pd.DataFrame:
    parts = []
    for name, pattern in [("ranks", None), *baselines.items()]:
        if configs["throughput_sps"].isna().all():
            s = configs.assign(speedup=np.nan, efficiency=np.nan, baseline_index=None)
        else:
            s = scaling.speedup(configs, cols, baseline=pattern)
        base = [configs.loc[i, "config"] if i is not None else None for i in s["baseline_index"]]
        parts.append(pd.DataFrame({"config": configs["config"], "baseline": name, "baseline_config": base,
                                   "speedup": s["speedup"], "efficiency": s["efficiency"]}))
        if pattern is not None and all(b is None for b in base):
            notes.append(f"baseline {name} ({pattern}) was not measured")
    return pd.concat(parts, ignore_index=True)


def _variation(ok: pd.DataFrame, cols: list[str], notes: list[str]) -> pd.DataFrame:
    parts = []
    for response in RESPONSES:
        if ok[response].isna().all():
            continue
        data = ok.sort_values(cols)  # design order: the first level is coded -1
        data[cols] = data[cols].astype(str)
        try:
            parts.append(scaling.allocation(data, cols, response))
        except ValueError as e:
            notes.append(f"allocation of variation of {response}: {e}")
            break
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=VARIATION.names)


def group_labels(ok: pd.DataFrame, others: list[str]) -> pd.Series:
    """The ``group_label`` of each run: its levels of the factors other than ranks."""
    if not others:
        return pd.Series("all runs", index=ok.index)
    return ok[others].astype(str).apply(lambda r: ", ".join(f"{k}={v}" for k, v in r.items()), axis=1)


def _fits(ok: pd.DataFrame, others: list[str], notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    rows, curves, preds = [], [], []
    groups = group_labels(ok, others)
    short = 0
    for response in FIT_RESPONSES:
        for label, g in ok.groupby(groups, sort=False):
            for model, degree in scaling.MODELS.items():
                fit = scaling.fit_poly(g["ranks"], g[response], degree)
                if fit is None:
                    short += 1
                    continue
                coef = list(fit.coef) + [np.nan] * (3 - len(fit.coef))
                rows.append({"response": response, "group_label": label, "model": model,
                             "intercept": coef[0], "slope": coef[1], "quadratic": coef[2],
                             "r2": fit.r2, "n": fit.n})
                grid = np.linspace(g["ranks"].min(), g["ranks"].max(), 40)
                curves.append(pd.DataFrame({"response": response, "group_label": label, "model": model,
                                            "ranks": grid, "value": fit(grid)}))
                held = scaling.holdout_fit(g["ranks"], g[response], degree) if response == "step_ms" else None
                if held is not None:
                    preds.append({"target": "step_ms", "holdout": f"ranks={held[0]:g} ({model})",
                                  "config": int(g.loc[g["ranks"] == held[0], "config"].iloc[0]),
                                  "ranks": int(held[0]), "predicted_ms": held[1], "measured_ms": held[2],
                                  "error_pct": 100 * (held[1] - held[2]) / held[2], "note": None})
    if short:
        levels = ok["ranks"].nunique()
        notes.append(f"{levels} rank count(s): a linear fit needs 2 and a quadratic one 3 "
                     "(predicting a held-out rank count needs one more)")
    fit_cols = FITS.names
    return (pd.DataFrame(rows, columns=fit_cols),
            pd.concat(curves, ignore_index=True) if curves else pd.DataFrame(
                columns=["response", "group_label", "model", "ranks", "value"]),
            pd.DataFrame(preds))


def _allreduce(points: pd.DataFrame, ok: pd.DataFrame, others: list[str], predict_ranks: list[int],
               notes: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The allreduce model, its hold-out predictions and any extrapolations."""
    cols = ALLREDUCE_MODEL.names
    pred_cols = PREDICTIONS.names
    points = points[points["run_name"].isin(ok["run_name"])]
    model = scaling.fit_allreduce(points) if len(points) else None
    if model is None:
        notes.append("allreduce model: the runs have fewer than two distinct message sizes x rank "
                     "counts (or no allreduce), so latency and bandwidth are not determined")
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=pred_cols)
    table = pd.DataFrame([{"latency_ms": model.latency_ms, "ms_per_byte": model.ms_per_byte,
                           "bandwidth_gbs": model.bandwidth_gbs, "r2": model.r2, "n": model.n}])
    holdouts: dict[str, pd.Series] = {}
    if points["config"].nunique() > 1:
        holdouts.update({f"config {c}": points["config"] == c for c in sorted(points["config"].unique())})
    if points["ranks"].nunique() > 1:
        holdouts.update({f"ranks={p}": points["ranks"] == p for p in sorted(points["ranks"].unique())})
    level_of = ok.set_index("run_name")
    for f in others:  # a factor whose levels change the message sizes: a model size
        sizes = points.groupby(points["run_name"].map(level_of[f]).astype(str), observed=True)["bytes"].apply(
            lambda b: tuple(sorted(set(b))))
        if sizes.nunique() > 1:
            lv = points["run_name"].map(level_of[f]).astype(str)
            holdouts.update({f"{f}={v}": lv == v for v in sizes.index})
    predictions = scaling.holdout_allreduce(points, holdouts)
    predictions.insert(0, "target", "allreduce_ms")
    extra = []
    groups = group_labels(ok, others)
    for label, g in ok.groupby(groups, sort=False):
        top = g[g["ranks"] == g["ranks"].max()]
        pts = points[points["run_name"] == top["run_name"].iloc[0]]
        for p in predict_ranks:
            extra.append({"target": "allreduce_ms", "holdout": "extrapolation",
                          "config": int(top["config"].iloc[0]), "ranks": p,
                          "predicted_ms": scaling.comm_per_step(model, pts.assign(ranks=p)),
                          "measured_ms": np.nan, "error_pct": np.nan, "note": f"messages of {label}"})
    if extra:
        predictions = pd.concat([predictions, pd.DataFrame(extra)], ignore_index=True)
    return table, predictions[pred_cols]


def write(c: Comparison) -> None:
    """Write the tables (and the *_wide tables with a column per factor) to ``c.db``, atomically."""
    tmp = c.db.with_name(f".{c.db.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    frames = dict(zip([t.name for t in SWEEP_TABLES + SWEEP_ENERGY_TABLES],
                      [c.runs, c.configs, c.speedups, c.variation, c.fits, c.allreduce_points,
                       c.allreduce_model, c.predictions, c.energy_runs, c.energy_configs], strict=True))
    try:
        with duckdb.connect(str(tmp)) as con:
            for table in SWEEP_TABLES + SWEEP_ENERGY_TABLES:
                con.execute(table.ddl())
                df = frames[table.name].reindex(columns=table.names)
                if "factors" in df:
                    df["factors"] = [json.dumps(f, default=str) for f in df["factors"]]
                con.register("rows", df)
                con.execute(f"INSERT INTO {table.name} SELECT * FROM rows")
                con.unregister("rows")
            for name, frame in (("comparison_wide", c.runs), ("configurations_wide", c.configs)):
                wide = frame.drop(columns=["factors"]).copy()
                for col in wide.columns:
                    if isinstance(wide[col].dtype, pd.CategoricalDtype):
                        wide[col] = wide[col].astype(object)
                con.register("wide", wide)
                con.execute(f"CREATE TABLE {name} AS SELECT * FROM wide")
                con.unregister("wide")
        os.replace(tmp, c.db)
    finally:
        tmp.unlink(missing_ok=True)


def text(c: Comparison, top_terms: int = 6, max_lines: int = 8) -> str:
    """What ``analyze compare`` prints: the configurations, then one line per model."""
    show = [*c.factors, "n", "step_ms", "step_ms_ci_low", "step_ms_ci_high", "throughput_sps",
            "comm_ms", "idle_ms", "speedup", "efficiency"]
    table = c.configs[[col for col in dict.fromkeys(show) if col in c.configs]].copy()
    for col in table.select_dtypes("number").columns:
        if col not in ("n", "ranks"):
            table[col] = table[col].map(lambda v: "" if pd.isna(v) else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}")
    lines = ["configurations (mean over replications; ci: 95% t interval):",
             table.to_string(index=False), ""]
    lines += energy.text(c.energy_configs, c.factors)
    for response, g in c.variation.groupby("response", sort=False):
        g = g.sort_values("percent", ascending=False)
        terms = [f"{t} {p:.1f}%" for t, p in zip(g["term"], g["percent"], strict=True)][:top_terms]
        method = "2^k r" if g["method"].iloc[0] == "2k_r" else "full factorial"
        lines.append(f"variation of {response} ({method}): " + ", ".join(terms))
    step_fits = c.fits[c.fits["response"] == "step_ms"]
    for r in step_fits.head(max_lines).itertuples():
        quad = "" if pd.isna(r.quadratic) else f" + {r.quadratic:.3g} p^2"
        lines.append(f"step_ms vs ranks, {r.group_label}: {r.model} {r.intercept:.3g} + {r.slope:.3g} p"
                     f"{quad} (R^2 {r.r2:.2f}, {r.n} runs)")
    if len(step_fits) > max_lines:
        lines.append(f"... {len(step_fits) - max_lines} more fits in the fits table")
    if len(c.allreduce_model):
        m = c.allreduce_model.iloc[0]
        bw = "not positive" if pd.isna(m["bandwidth_gbs"]) else f"{m['bandwidth_gbs']:.3g} GB/s"
        lines.append(f"allreduce model: latency {m['latency_ms']:.3g} ms, bandwidth {bw} "
                     f"(R^2 {m['r2']:.2f}, {int(m['n'])} run x size points)")
    held = c.predictions.dropna(subset=["measured_ms", "predicted_ms"])
    for target, g in held.groupby("target", sort=False):
        worst = g.loc[g["error_pct"].abs().idxmax()]
        lines.append(f"hold-out predictions of {target}: {len(g)}, mean |error| "
                     f"{g['error_pct'].abs().mean():.1f}%, worst {worst['error_pct']:+.1f}% "
                     f"({worst['holdout']})")
    extra = c.predictions[c.predictions["holdout"] == "extrapolation"]
    same = extra.assign(ms=extra["predicted_ms"].round(6)).groupby(["ranks", "ms"], sort=False)["note"]
    for (ranks, ms), notes in same:  # configurations with the same messages predict the same
        whose = notes.iloc[0] if len(notes) == 1 else f"{len(notes)} configurations with the same messages"
        lines.append(f"predicted allreduce time per step at {int(ranks)} ranks: {ms:.3g} ms ({whose})")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def is_sweep(path: Path) -> bool:
    """A directory of runs (``instrument sweep``'s, or any) rather than one run or archive."""
    if not path.is_dir() or any(path.glob("*.otf2")):
        return False
    return (path / SWEEP_JSON).is_file() or any((p / "run.json").is_file() for p in path.iterdir() if p.is_dir())
