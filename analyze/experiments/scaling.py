"""Statistics of designed experiments: confidence intervals, speedup, allocation of variation,
scaling fits and an allreduce cost model with hold-out predictions.

Pure functions of pandas tables (no database, no plotting). The methods follow Jain, *The Art
of Computer Systems Performance Analysis* (1991): t-based confidence intervals over
replications (ch. 13), the 2^k r factorial design with effects from the sign table and the
allocation of variation SST = sum of SS_term + SSE (ch. 18), and, for factors with more than
two levels, the full-factorial decomposition into main effects and interactions (ch. 22).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
ERROR_TERM = "error"


def t_quantile(dof: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided t quantile t[1 - alpha/2; dof]."""
    return float(stats.t.ppf(0.5 + confidence / 2, dof))


def mean_ci(values: Any, confidence: float = CONFIDENCE) -> tuple[float, float, float, int]:
    """(mean, low, high, n): the mean of ``values`` (NaNs dropped) with a t-distribution
    confidence interval over them; low/high are NaN with fewer than two values."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    n = len(v)
    if n == 0:
        return np.nan, np.nan, np.nan, 0
    m = float(v.mean())
    if n < 2:
        return m, np.nan, np.nan, 1
    half = t_quantile(n - 1, confidence) * float(v.std(ddof=1)) / np.sqrt(n)
    return m, m - half, m + half, n


def summarize(runs: pd.DataFrame, by: list[str], columns: list[str],
              confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per group of ``by``: n, and for each column its mean, ci_low, ci_high."""
    rows = []
    for key, g in runs.groupby(by, sort=False, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        for col in columns:
            m, lo, hi, n = mean_ci(g[col], confidence)
            row.update({col: m, f"{col}_ci_low": lo, f"{col}_ci_high": hi})
            row["n"] = max(row.get("n", 0), n)
        rows.append(row)
    return pd.DataFrame(rows)


def speedup(configs: pd.DataFrame, factors: list[str], value: str = "throughput_sps",
            ranks: str = "ranks", baseline: dict[str, Any] | None = None) -> pd.DataFrame:
    """Speedup and parallel efficiency of each configuration against its baseline.

    ``configs`` has one row per configuration with the ``factors`` columns, ``ranks`` and the
    throughput-like ``value`` (larger is faster). The baseline of a row is the configuration
    that equals it on every factor not named in ``baseline`` and has the ``baseline`` levels;
    without ``baseline``, the configuration with the fewest ranks and otherwise the same levels
    (the ranks factor itself, or nodes, is what varies). speedup = value / baseline value,
    efficiency = speedup / (ranks / baseline ranks). Returns the rows of ``configs`` with
    ``baseline_index`` (row label in ``configs``), ``speedup`` and ``efficiency``; NaN where no
    baseline configuration was measured.
    """
    if baseline is None:
        scale = [f for f in factors if f in (ranks, "nodes")]
        same = [f for f in factors if f not in scale]
    else:
        same = [f for f in factors if f not in baseline]
    out = configs.copy()
    base_idx: list[Any] = []
    for _, row in configs.iterrows():
        mask = np.ones(len(configs), dtype=bool)
        for f in same:
            mask &= (configs[f] == row[f]).to_numpy()
        if baseline is None:
            cands = configs[mask]
            cands = cands[cands[ranks] == cands[ranks].min()] if len(cands) else cands
        else:
            for f, level in baseline.items():
                mask &= (configs[f].astype(str) == str(level)).to_numpy()
            cands = configs[mask]
        base_idx.append(cands.index[0] if len(cands) else None)
    out["baseline_index"] = base_idx
    base_value = np.array([configs.loc[i, value] if i is not None else np.nan for i in base_idx], float)
    base_ranks = np.array([configs.loc[i, ranks] if i is not None else np.nan for i in base_idx], float)
    out["speedup"] = configs[value].to_numpy(float) / base_value
    out["efficiency"] = out["speedup"] / (configs[ranks].to_numpy(float) / base_ranks)
    return out


# --- allocation of variation -------------------------------------------------------------

def _terms(factors: list[str]) -> list[tuple[str, ...]]:
    """Main effects, then two-factor interactions, ... up to the k-factor one."""
    return [t for k in range(1, len(factors) + 1) for t in itertools.combinations(factors, k)]


def _balanced(runs: pd.DataFrame, factors: list[str], response: str) -> tuple[pd.DataFrame, int]:
    """The runs with a response, r per cell where r is the smallest replication count, and r.

    Raises ValueError when a combination of levels has no measurement at all."""
    data = runs.dropna(subset=[response])
    cells = data.groupby(factors, sort=False).size()
    levels = [data[f].unique() for f in factors]
    expected = int(np.prod([len(lv) for lv in levels]))
    if len(cells) < expected:
        raise ValueError(f"{expected - len(cells)} of {expected} combinations of levels have no "
                         f"successful run, so the variation of {response} cannot be allocated")
    r = int(cells.min())
    return data.groupby(factors, sort=False).head(r), r


def allocation_2kr(runs: pd.DataFrame, factors: list[str], response: str,
                   confidence: float = CONFIDENCE) -> pd.DataFrame:
    """Jain's 2^k r analysis: every factor has two levels; each of the 2^k cells r runs.

    The first level of each factor (in order of appearance in ``runs``, which the caller
    sorts) is coded -1, the second +1. Returns one row per term and one ``error`` row:
    ``term`` (factors joined by ``:``), ``dof``, ``effect`` (q, half the difference the term
    makes; NaN for error), ``ss`` (2^k r q^2), ``percent`` (100 ss / SST; the rows sum to 100),
    ``effect_ci_low``/``effect_ci_high`` (t interval with 2^k (r-1) degrees of freedom).
    The grand mean is in ``attrs["mean"]``.
    """
    data, r = _balanced(runs, factors, response)
    k = len(factors)
    signs = {}
    for f in factors:
        lv = list(dict.fromkeys(data[f]))
        if len(lv) != 2:
            raise ValueError(f"factor {f} has {len(lv)} levels; a 2^k r design needs two")
        signs[f] = np.where(data[f].to_numpy() == lv[0], -1.0, 1.0)
    y = data[response].to_numpy(float)
    cell_mean = data.groupby(factors, sort=False)[response].transform("mean").to_numpy(float)
    sse = float(((y - cell_mean) ** 2).sum())
    sst = float(((y - y.mean()) ** 2).sum())
    n = 2 ** k * r
    err_dof = 2 ** k * (r - 1)
    s_q = np.sqrt(sse / err_dof) / np.sqrt(n) if err_dof > 0 else np.nan
    half = t_quantile(err_dof, confidence) * s_q if err_dof > 0 else np.nan
    rows = []
    for term in _terms(factors):
        x = np.prod([signs[f] for f in term], axis=0)
        q = float((x * y).sum() / n)  # each cell appears r times: the mean of sign x cell mean
        rows.append({"term": ":".join(term), "dof": 1, "effect": q, "ss": n * q * q,
                     "effect_ci_low": q - half, "effect_ci_high": q + half})
    rows.append({"term": ERROR_TERM, "dof": err_dof, "effect": np.nan, "ss": sse,
                 "effect_ci_low": np.nan, "effect_ci_high": np.nan})
    out = pd.DataFrame(rows)
    out["percent"] = 100 * out["ss"] / sst if sst > 0 else np.nan
    out.attrs["mean"] = float(y.mean())
    out.attrs["replications"] = r
    return out


def allocation_anova(runs: pd.DataFrame, factors: list[str], response: str) -> pd.DataFrame:
    """Full-factorial decomposition of variation for factors with any number of levels.

    Balanced data (the smallest replication count r is used in every cell). The effect of a
    term S at a cell is the Moebius inversion of marginal means, sum over subsets T of S of
    (-1)^(|S|-|T|) mean_T, so the terms are orthogonal and SST = sum of SS_S + SSE exactly.
    Returns ``term``, ``dof`` (product of levels-1), ``ss``, ``percent``, ``f_value`` and
    ``p_value`` (F test against the error mean square; NaN without replications), and an
    ``error`` row.
    """
    data, r = _balanced(runs, factors, response)
    y = data[response].to_numpy(float)
    grand = y.mean()
    sst = float(((y - grand) ** 2).sum())
    cell_mean = data.groupby(factors, sort=False)[response].transform("mean").to_numpy(float)
    sse = float(((y - cell_mean) ** 2).sum())
    n_levels = {f: data[f].nunique() for f in factors}
    cells = int(np.prod(list(n_levels.values())))
    err_dof = cells * (r - 1)
    marginal: dict[tuple[str, ...], np.ndarray] = {(): np.full(len(y), grand)}
    for term in _terms(factors):
        marginal[term] = data.groupby(list(term), sort=False)[response].transform("mean").to_numpy(float)
    rows = []
    for term in _terms(factors):
        effect = np.zeros(len(y))
        for k in range(len(term) + 1):
            for sub in itertools.combinations(term, k):
                effect += (-1) ** (len(term) - k) * marginal[sub]
        dof = int(np.prod([n_levels[f] - 1 for f in term]))
        rows.append({"term": ":".join(term), "dof": dof, "ss": float((effect ** 2).sum())})
    rows.append({"term": ERROR_TERM, "dof": err_dof, "ss": sse})
    out = pd.DataFrame(rows)
    out["percent"] = 100 * out["ss"] / sst if sst > 0 else np.nan
    mse = sse / err_dof if err_dof > 0 else np.nan
    out["f_value"] = np.where(out["term"] == ERROR_TERM, np.nan, out["ss"] / out["dof"] / mse)
    out["p_value"] = [float(stats.f.sf(f, d, err_dof)) if np.isfinite(f) else np.nan
                      for f, d in zip(out["f_value"], out["dof"], strict=True)]
    out.attrs["mean"] = float(grand)
    out.attrs["replications"] = r
    return out


def allocation(runs: pd.DataFrame, factors: list[str], response: str) -> pd.DataFrame:
    """2^k r analysis when every factor has two levels, else the full-factorial one; the
    result has a ``method`` column (``2k_r`` or ``anova``) and the columns of both."""
    factors = [f for f in factors if runs[f].nunique() > 1]
    if not factors:
        raise ValueError("no factor has more than one level")
    if all(runs[f].nunique() == 2 for f in factors):
        out = allocation_2kr(runs, factors, response)
        anova = allocation_anova(runs, factors, response)
        out["f_value"], out["p_value"] = anova["f_value"].to_numpy(), anova["p_value"].to_numpy()
        out.insert(0, "method", "2k_r")
    else:
        out = allocation_anova(runs, factors, response)
        out.insert(0, "method", "anova")
        for col in ("effect", "effect_ci_low", "effect_ci_high"):
            out[col] = np.nan
    out.insert(0, "response", response)
    return out


# --- fits ------------------------------------------------------------------------------------

MODELS = {"linear": 1, "quadratic": 2}


@dataclass(frozen=True)
class Fit:
    coef: tuple[float, ...]  # intercept, slope, quadratic term (as many as the degree needs)
    r2: float
    n: int

    def __call__(self, x: Any) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return sum(c * x ** i for i, c in enumerate(self.coef))  # type: ignore[return-value]


def fit_poly(x: Any, y: Any, degree: int) -> Fit | None:
    """Least-squares polynomial y = c0 + c1 x (+ c2 x^2) with R^2 = 1 - SSE/SST; None when
    ``x`` has fewer than degree + 1 distinct values (the fit would not be determined)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(np.unique(x)) < degree + 1:
        return None
    a = np.vander(x, degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    sst = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float((resid ** 2).sum()) / sst if sst > 0 else 1.0
    return Fit(tuple(float(c) for c in coef), r2, len(x))


def ring_bytes(nbytes: Any, ranks: Any) -> np.ndarray:
    """Bytes each rank sends in a ring allreduce of ``nbytes``: 2 (p-1)/p of them."""
    p = np.asarray(ranks, dtype=float)
    return 2 * (p - 1) / p * np.asarray(nbytes, dtype=float)


@dataclass(frozen=True)
class AllreduceModel:
    """t = latency + ring_bytes / bandwidth for one allreduce (ms, bytes)."""

    latency_ms: float
    ms_per_byte: float
    r2: float
    n: int

    @property
    def bandwidth_gbs(self) -> float:
        """Bytes per second / 1e9 (NaN when the fitted slope is not positive)."""
        return 1e-6 / self.ms_per_byte if self.ms_per_byte > 0 else np.nan

    def predict_ms(self, nbytes: Any, ranks: Any) -> np.ndarray:
        return self.latency_ms + self.ms_per_byte * ring_bytes(nbytes, ranks)


def fit_allreduce(points: pd.DataFrame) -> AllreduceModel | None:
    """Fit :class:`AllreduceModel` to ``points`` (``bytes``, ``ranks``, ``transfer_ms``: the mean
    transfer time of one allreduce of that size in one run). None when the points have fewer
    than two distinct ring-byte values."""
    fit = fit_poly(ring_bytes(points["bytes"], points["ranks"]), points["transfer_ms"], 1)
    if fit is None:
        return None
    return AllreduceModel(fit.coef[0], fit.coef[1], fit.r2, fit.n)


def comm_per_step(model: AllreduceModel, points: pd.DataFrame) -> float:
    """Predicted allreduce time per step: sum over message sizes of calls per step x time."""
    return float((points["calls_per_step"] * model.predict_ms(points["bytes"], points["ranks"])).sum())


def holdout_allreduce(points: pd.DataFrame, holdouts: dict[str, pd.Series]) -> pd.DataFrame:
    """Prediction error of the allreduce model on data it was not fitted to.

    ``points``: one row per run and message size (``run_name``, ``config``, ``ranks``,
    ``bytes``, ``calls_per_step``, ``transfer_ms``). ``holdouts``: name -> boolean mask over
    ``points`` of the rows to hold out. For each, the model is fitted to the other rows and
    the allreduce time per step of each held-out configuration is predicted (mean over its
    runs) and compared with the measured one: ``error_pct`` = 100 (predicted - measured) /
    measured. A hold-out whose remaining rows do not determine the model gives one row with
    NaN predictions and ``note`` saying so.
    """
    rows = []
    for name, mask in holdouts.items():
        model = fit_allreduce(points[~mask])
        held = points[mask]
        if model is None:
            rows.append({"holdout": name, "config": None, "ranks": None, "predicted_ms": np.nan,
                         "measured_ms": np.nan, "error_pct": np.nan,
                         "note": "the other runs have a single message size and rank count: "
                                 "the model is not determined"})
            continue
        held = held.assign(pred=held["calls_per_step"] * model.predict_ms(held["bytes"], held["ranks"]),
                           meas=held["calls_per_step"] * held["transfer_ms"])
        per_run = held.groupby(["config", "ranks", "run_name"], sort=False)[["pred", "meas"]].sum()
        for (config, ranks), g in per_run.groupby(level=["config", "ranks"], sort=False):
            pred, meas = float(g["pred"].mean()), float(g["meas"].mean())
            rows.append({"holdout": name, "config": config, "ranks": int(ranks),
                         "predicted_ms": pred, "measured_ms": meas,
                         "error_pct": 100 * (pred - meas) / meas if meas else np.nan, "note": None})
    return pd.DataFrame(rows, columns=["holdout", "config", "ranks", "predicted_ms", "measured_ms",
                                       "error_pct", "note"])


def holdout_fit(x: Any, y: Any, degree: int) -> tuple[float, float, float] | None:
    """Fit a polynomial without the largest x and predict the mean y there.

    Returns (x held out, predicted, measured mean), or None when the remaining points do not
    determine the polynomial."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    top = x.max()
    fit = fit_poly(x[x < top], y[x < top], degree)
    if fit is None:
        return None
    return float(top), float(fit(top)), float(y[x == top].mean())
