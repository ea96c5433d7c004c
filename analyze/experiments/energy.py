"""Energy across a sweep: per run energy, energy per sample and the energy-delay product, per
configuration their means and the EDP normalized to a baseline configuration.

EDP = run time x the sum of the devices' energies over that time (the steps' window), once
over the active devices and once including the idle ones (GPUs pinned to no rank). Normalized
EDP is a configuration's EDP over its baseline's: the configuration with the levels the user
names (``--baseline config=1gpu``), the other factors equal, or without one, the one with the
fewest ranks. Lower is better; EDP only compares runs that do the same work (the same steps
and global batch), otherwise compare ``energy_per_sample_j``.
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze import power, views
from analyze.experiments import scaling
from analyze.schema import ENERGY_CONFIGURATIONS, ENERGY_RUNS


def run_energy(con: duckdb.DuckDBPyConnection, samples_per_step: float | None) -> dict[str, Any] | None:
    """The energy_runs columns of one run's database (None when it has no power)."""
    if not power.available(con):
        return None
    lo, hi = con.execute("SELECT min(start_ns), max(end_ns) FROM steps").fetchone() or (None, None)
    if lo is None or hi is None or hi <= lo:
        return None
    a, b = views.steady_steps(con)
    s_lo, s_hi = con.execute("SELECT min(start_ns), max(end_ns) FROM steps WHERE step >= $a AND step < $b",
                             {"a": a, "b": b}).fetchone() or (None, None)
    run_s = (hi - lo) / 1e9
    energy, energy_all = power.window(con, lo, hi), power.window(con, lo, hi, active_only=False)
    per_step = power.window(con, s_lo, s_hi) / (b - a) if s_lo is not None and b > a else np.nan
    return {"run_s": run_s, "energy_j": energy, "energy_all_j": energy_all,
            "mean_power_w": energy / run_s, "energy_per_step_j": per_step,
            "energy_per_sample_j": per_step / samples_per_step if samples_per_step else np.nan,
            "edp_js": run_s * energy, "edp_all_js": run_s * energy_all}


def configurations(runs: pd.DataFrame, factors: list[str], baseline: dict[str, Any] | None) -> pd.DataFrame:
    """The energy_configurations table from energy_runs rows that carry ``config``,
    ``config_label``, ``ranks`` and a column per factor (design order)."""
    if runs.empty:
        return pd.DataFrame(columns=ENERGY_CONFIGURATIONS.names)
    configs = scaling.summarize(runs, ["config", "config_label"],
                                ["run_s", "energy_j", "energy_all_j", "energy_per_sample_j", "mean_power_w",
                                 "edp_js", "edp_all_js"])
    first = runs.drop_duplicates("config").set_index("config")
    for col in ["ranks", *factors]:
        if col in first:
            configs[col] = configs["config"].map(first[col])
    configs = configs.reset_index(drop=True)
    configs["inverse_run_s"] = 1 / configs["run_s"]
    cols = [f for f in factors if f in configs]
    base = {k: v for k, v in (baseline or {}).items()}
    rows = {}
    for value in ("edp_js", "edp_all_js", "inverse_run_s"):
        rows[value] = scaling.speedup(configs, cols, value=value, baseline=base or None)
    configs["baseline"] = ", ".join(f"{k}={v}" for k, v in base.items()) if base else "ranks"
    index = rows["edp_js"]["baseline_index"]
    configs["baseline_config"] = [configs.loc[i, "config"] if i is not None else None for i in index]
    configs["edp_norm"] = rows["edp_js"]["speedup"]  # edp / the baseline's edp
    configs["edp_all_norm"] = rows["edp_all_js"]["speedup"]
    configs["time_speedup"] = rows["inverse_run_s"]["speedup"]
    return configs


def empty_runs() -> pd.DataFrame:
    return pd.DataFrame(columns=ENERGY_RUNS.names)


def text(configs: pd.DataFrame, factors: list[str]) -> list[str]:
    """What ``analyze compare`` prints about energy."""
    if configs.empty:
        return []
    show = [c for c in dict.fromkeys([*factors, "n", "run_s", "energy_j", "energy_all_j", "energy_per_sample_j",
                                      "time_speedup", "edp_norm", "edp_all_norm"]) if c in configs]
    table = configs[show].copy()
    for col in table.select_dtypes("number").columns:
        if col not in ("n", "ranks"):
            table[col] = table[col].map(lambda v: "" if pd.isna(v) else f"{v:.3g}")
    base = configs["baseline"].iloc[0]
    return [f"energy (steps' window; edp_norm: EDP / the baseline's, {base}; _all: idle devices too):",
            table.to_string(index=False), ""]
