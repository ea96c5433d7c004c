"""Running energy totals of one channel's samples, from an energy counter or power readings.

A series is a channel's samples on one location, in time order: ``t`` (ns) and ``v`` (in J
or W after the channel's ``to_si``). :func:`running_energy` returns the energy since the first
sample at each sample time; between samples it is taken to grow linearly, so the energy of any
window is a difference of two interpolated totals (:mod:`analyze.energy.attribution`).

- Energy, values never decreasing: a running total (RAPL, NVML, ROCm SMI counters; also
  Score-P's x86_energy plugin, which declares ACCUMULATED_LAST but writes running totals,
  ``src/x86_energy_measurement_thread.cpp``). Whatever the declared mode, this is what the
  values are.
- Energy, values going down: a running total that restarted (mode ACCUMULATED_START: the new
  value counts from zero), or amounts per interval (other modes: ``*_NEXT`` for the interval
  up to the next sample, otherwise the interval since the previous one).
- Power: integrated over time. ``*_LAST``: the reading holds since the previous sample;
  ``*_NEXT``: until the next one; otherwise (POINT, or the ACCUMULATED_START Score-P's PAPI
  plugins declare for everything) the trapezoid rule between samples.
"""

from __future__ import annotations

import numpy as np

from analyze.schema import Quantity

NS = 1e9


def running_energy(t: np.ndarray, v: np.ndarray, quantity: Quantity | str, mode: str) -> np.ndarray:
    """Energy in J since the first sample, at each sample time (see the module doc)."""
    t = np.asarray(t, dtype=np.int64)
    v = np.asarray(v, dtype=np.float64)
    if len(v) == 0:
        return np.zeros(0)
    dt = np.diff(t) / NS
    if quantity == Quantity.ENERGY:
        steps = np.diff(v)
        if (steps >= 0).all():
            return v - v[0]
        if mode == "accumulated_start":
            steps = np.where(steps < 0, v[1:], steps)
        elif mode.endswith("_next"):
            steps = v[:-1]
        else:
            steps = v[1:]
    elif mode.endswith("_last"):
        steps = v[1:] * dt
    elif mode.endswith("_next"):
        steps = v[:-1] * dt
    else:
        steps = (v[1:] + v[:-1]) / 2 * dt
    return np.concatenate([[0.0], np.cumsum(steps)])


def median_interval_ns(t: np.ndarray) -> float:
    """The median time between samples (NaN with fewer than two)."""
    return float(np.median(np.diff(t))) if len(t) > 1 else float("nan")
