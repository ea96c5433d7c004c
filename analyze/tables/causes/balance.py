"""Heterogeneous ranks: per-rank throughput and the shares of the global batch that would
balance the step (the ``rank_balance`` table).

Model, per rank r: compute_r = fixed_r + share_r / rate_r, where the scaled part (compute
inside data loading, forward and backward) grows with the rank's share of the batch and the
fixed part (optimizer, the step's own code) does not; rate_r = share_r / scaled_r is measured.
The balanced shares give every rank the same compute time T with the shares summing to 1:

    share_r = (T - fixed_r) rate_r,   T = (1 + sum_r fixed_r rate_r) / sum_r rate_r

(a rank whose fixed time alone exceeds T gets share 0 and T is solved again without it).
The predicted step time is T plus the ranks' mean exposed communication (allreduce,
other_comm and other phases), with no idle time left.

A script that splits its global batch unequally says so with ``--global-batch N --shares
a,b,...`` (its run.json parameters; runs/hetero_shares.py); otherwise shares are equal and the
samples per rank are ``batch_size x accumulate`` when the script passes ``--batch-size``.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze.schema import RANK_BALANCE
from analyze.tables.causes.window import COMPUTE, IDLE, Window
from analyze.tables.phases import PHASES


def step_summary(win: Window) -> pd.DataFrame:
    """Per rank and step of a window, from the phase model's sweep: duration_ns, compute_ns,
    idle_ns, comm_ns (allreduce, other_comm and other) and scaled_ns (compute inside data
    loading, forward or backward). The phases equal the phases table's. Columns are gathered
    per rank and made into one frame (a frame per rank took 3 s at 4,096 ranks)."""
    names = ("rank", "step", "duration_ns", "compute_ns", "idle_ns", "comm_ns", "scaled_ns")
    parts: dict[str, list[np.ndarray]] = {c: [] for c in names}
    for rank, rw in win.ranks.items():
        n = len(rw.steps)
        if len(rw.bounds) < 2 or n == 0:
            continue
        inside = rw.step_of >= 0
        length = np.diff(rw.bounds)[inside]
        code = rw.codes[inside]
        step = rw.step_of[inside]
        per_phase = np.bincount(step * len(PHASES) + code, weights=length,
                                minlength=n * len(PHASES)).astype(np.int64).reshape(n, len(PHASES))
        for c, v in (("rank", np.full(n, rank, np.int64)), ("step", rw.steps),
                     ("duration_ns", rw.step_end - rw.step_start),
                     ("compute_ns", per_phase[:, COMPUTE]), ("idle_ns", per_phase[:, IDLE]),
                     ("comm_ns", per_phase.sum(axis=1) - per_phase[:, COMPUTE] - per_phase[:, IDLE]),
                     ("scaled_ns", np.bincount(step, weights=length * ((code == COMPUTE) & rw.per_sample[inside]),
                                               minlength=n).astype(np.int64))):
            parts[c].append(v)
    if not parts["rank"]:
        return pd.DataFrame(columns=list(names))
    return pd.DataFrame({c: np.concatenate(v) for c, v in parts.items()})


def split_batch(total: int, shares: list[float]) -> list[int]:
    """``total`` samples split in proportion to ``shares``, in whole samples (largest remainders,
    ties to the lower rank). runs/hetero_shares.py splits its batches the same way."""
    s = np.asarray(shares, float) / float(sum(shares))
    exact = s * total
    base = np.floor(exact).astype(int)
    order = np.argsort(-(exact - base), kind="stable")
    base[order[: total - int(base.sum())]] += 1
    return [int(v) for v in base]


def parse_shares(value: Any, ranks: int) -> list[float] | None:
    """Shares from a run parameter ("0.7,0.3" or a list); None if absent or not one per rank."""
    if value is None:
        return None
    items = value if isinstance(value, list) else str(value).split(",")
    try:
        shares = [float(v) for v in items]
    except ValueError:
        return None
    if len(shares) != ranks or min(shares) < 0 or sum(shares) <= 0:
        return None
    return [v / sum(shares) for v in shares]


def solve(fixed: np.ndarray, scaled: np.ndarray, shares: np.ndarray) -> tuple[np.ndarray, float]:
    """(balanced shares, T): the shares that give every rank the same compute T [ms]."""
    rate = np.where(scaled > 0, shares / np.where(scaled > 0, scaled, 1), 0.0)
    active = rate > 0
    if not active.any():  # no compute that scales with the samples: nothing to move
        return np.asarray(shares, float), float(np.max(fixed)) if len(fixed) else float("nan")
    for _ in range(len(rate)):
        t = (1 + (fixed * rate)[active].sum()) / rate[active].sum()
        new = np.where(active, (t - fixed) * rate, 0.0)
        if (new >= 0).all():
            return new, float(t)
        active &= new > 0
    return np.where(active, (t - fixed) * rate, 0.0), float(t)


def batch_of(params: dict[str, Any], ranks: int) -> tuple[list[float], float | None]:
    """(shares, global batch or None) from run.json's parameters."""
    shares = parse_shares(params.get("shares"), ranks)
    total = params.get("global_batch")
    if shares is not None:
        return shares, float(total) if isinstance(total, int | float) else None
    batch = params.get("batch_size")
    if isinstance(batch, int):
        return [1.0 / ranks] * ranks, float(batch * int(params.get("accumulate", 1)) * ranks)
    return [1.0 / ranks] * ranks, float(total) if isinstance(total, int | float) else None


def medians(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, step_ms, compute_ms, scaled_ms, comm_ms, idle_ms: medians over the
    steps after the run's first (warm-up), or over the only step. ``per_step``:
    :func:`step_summary` of every window."""
    if per_step.empty:
        return pd.DataFrame(columns=["rank", "steps", "step_ms", "compute_ms", "scaled_ms", "comm_ms", "idle_ms"])
    first = per_step["step"].min()
    used = per_step[(per_step["step"] > first) | (per_step.groupby("rank")["step"].transform("count") == 1)]
    g = used.groupby("rank")
    df = pd.DataFrame({"steps": g.size()})
    for col, src in (("step_ms", "duration_ns"), ("compute_ms", "compute_ns"), ("scaled_ms", "scaled_ns"),
                     ("comm_ms", "comm_ns"), ("idle_ms", "idle_ns")):
        df[col] = g[src].median() / 1e6
    df = df.reset_index()
    if (df["scaled_ms"] <= 0).all():  # no data loading/forward/backward regions
        df["scaled_ms"] = df["compute_ms"]
    return df


def rebalance(m: pd.DataFrame, shares: list[float], global_batch: float | None) -> pd.DataFrame:
    """The ``rank_balance`` rows from per-rank medians (:func:`medians`) and the shares the
    run used."""
    out = m.copy()
    out["share"] = shares
    total = int(round(global_batch)) if global_batch else None
    out["samples"] = split_batch(total, shares) if total else np.nan
    out["fixed_ms"] = (out["compute_ms"] - out["scaled_ms"]).clip(lower=0)
    out["throughput_sps"] = out["samples"] / (out["scaled_ms"] / 1000).where(out["scaled_ms"] > 0)
    balanced, t = solve(out["fixed_ms"].to_numpy(float), out["scaled_ms"].to_numpy(float),
                        out["share"].to_numpy(float))
    out["balanced_share"] = balanced
    out["balanced_samples"] = split_batch(total, list(balanced)) if total else pd.NA
    out["predicted_compute_ms"] = t
    out["predicted_step_ms"] = t + float(out["comm_ms"].fillna(0).mean())
    return out[RANK_BALANCE.names]


def rank_balance(con: duckdb.DuckDBPyConnection, per_step: pd.DataFrame) -> pd.DataFrame:
    """The ``rank_balance`` rows of a run, shares and batch from its run.json parameters;
    ``per_step``: :func:`step_summary` of every window."""
    m = medians(per_step)
    if m.empty:
        return pd.DataFrame(columns=RANK_BALANCE.names)
    rows = con.execute("SELECT params FROM runs").fetchall()
    row = rows[0] if rows else None
    params = json.loads(row[0]) if row and row[0] else {}
    shares, total = batch_of(params, len(m))
    return rebalance(m, shares, total)
