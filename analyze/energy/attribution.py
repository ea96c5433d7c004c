"""Energy of time windows from a running total, and how far power readings lag a counter.

A running total is known at its sample times and taken as linear in between (the only
assumption a sampled counter allows). The energy of a window is therefore exact when the
window's ends are sample times, and otherwise split in proportion to time inside the sampling
interval that contains an end: phases much shorter than the sampling interval get the average
power of the intervals around them, not their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_LAG_NS = 2_000_000_000
LAG_STEP_NS = 5_000_000
LAG_TOLERANCE = 1.05  # the smallest lag whose misfit is within 5% of the best one
GRID_POINTS = 4000


def window_energy(t: np.ndarray, total: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Energy (J) of each window [start, end) (ns); parts outside the first..last sample count 0."""
    if len(t) < 2:
        return np.zeros(len(np.atleast_1d(start)))
    tf = np.asarray(t, dtype=np.float64)
    return np.interp(np.asarray(end, dtype=np.float64), tf, total) - np.interp(
        np.asarray(start, dtype=np.float64), tf, total)


def covered_ns(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How much of each window lies within the first..last sample."""
    if len(t) < 2:
        return np.zeros(len(np.atleast_1d(start)), dtype=np.int64)
    lo = np.maximum(np.asarray(start), t[0])
    hi = np.minimum(np.asarray(end), t[-1])
    return np.maximum(hi - lo, 0).astype(np.int64)


def _misfit(tc: np.ndarray, cc: np.ndarray, tp: np.ndarray, cp: np.ndarray, lag: int) -> float:
    lo, hi = max(tc[0], tp[0] - lag), min(tc[-1], tp[-1] - lag)
    grid = tc[(tc >= lo) & (tc <= hi)]
    if len(grid) < 3:
        return float("inf")
    if len(grid) > GRID_POINTS:
        grid = grid[np.linspace(0, len(grid) - 1, GRID_POINTS).astype(np.int64)]
    g = grid.astype(np.float64)
    counter = np.interp(g, tc, cc)
    counter -= counter[0]
    power = np.interp(g, (tp - lag).astype(np.float64), cp)
    power -= power[0]
    # the shape, not the scale: a power reading a few percent off must not pull the lag
    scale = float(power @ counter) / float(power @ power) if power.any() else 1.0
    return float(np.sqrt(np.mean((scale * power - counter) ** 2)))


def estimate_lag(tc: np.ndarray, cc: np.ndarray, tp: np.ndarray, cp: np.ndarray,
                 max_lag_ns: int = MAX_LAG_NS, step_ns: int = LAG_STEP_NS) -> int:
    """How far (ns, 0..max_lag_ns) the power readings' running total ``cp`` at ``tp`` trails
    the counter's ``cc`` at ``tc``: the smallest lag whose misfit (RMS difference of the two
    running totals on the counter's samples) is within 5% of the best. A reading that is an
    average over the last W seconds trails by about W/2; where the power does not change, any
    lag fits and the smallest, 0, is taken."""
    lags = np.arange(0, max_lag_ns + 1, step_ns, dtype=np.int64)
    misfit = np.array([_misfit(tc, cc, tp, cp, int(lag)) for lag in lags])
    if not np.isfinite(misfit).any():
        return 0
    best = np.nanmin(misfit)
    return int(lags[np.flatnonzero(misfit <= best * LAG_TOLERANCE + 1e-9)[0]])


@dataclass
class Agreement:
    start_ns: int
    end_ns: int
    counter_j: float
    power_j: float
    lag_ns: int
    aligned_end_ns: int
    aligned_counter_j: float
    aligned_power_j: float

    @staticmethod
    def pct(power: float, counter: float) -> float:
        return 100 * (power - counter) / counter if counter else float("nan")


def agreement(tc: np.ndarray, cc: np.ndarray, tp: np.ndarray, cp: np.ndarray) -> Agreement | None:
    """The energy a counter and a device's integrated power readings give over the window
    both cover, as read and with the readings shifted back by their estimated lag."""
    lo, hi = max(tc[0], tp[0]), min(tc[-1], tp[-1])
    if len(tc) < 2 or len(tp) < 2 or hi <= lo:
        return None
    lag = estimate_lag(tc, cc, tp, cp)
    a_lo, a_hi = max(tc[0], tp[0] - lag), min(tc[-1], tp[-1] - lag)
    counter = float(window_energy(tc, cc, lo, hi))
    power = float(window_energy(tp, cp, lo, hi))
    a_counter = float(window_energy(tc, cc, a_lo, a_hi)) if a_hi > a_lo else float("nan")
    a_power = float(window_energy(tp - lag, cp, a_lo, a_hi)) if a_hi > a_lo else float("nan")
    return Agreement(int(lo), int(hi), counter, power, lag, int(a_hi), a_counter, a_power)
