"""Per-step figures of long runs: at most :data:`MAX_BARS` bars a panel.

A bar per step is what a run of tens or hundreds of steps needs. A run of 10^5 steps would
draw millions of rectangles (a PDF no viewer opens, minutes to write), so consecutive steps
are grouped into bins of ``per`` steps and each bar is the bin's mean per step, drawn at the
bin's first step. Steps a frame has no row for (a step without idle time, a rank off the
critical path) count as zero, so the means are over every step of the bin.
"""

from __future__ import annotations

import pandas as pd

MAX_BARS = 400  # bars per panel before steps are binned


def steps_per_bar(steps: pd.Series, most: int = MAX_BARS) -> int:
    """How many consecutive steps one bar shows: 1 while the steps fit in ``most`` bars."""
    if steps.empty:
        return 1
    span = int(steps.max()) - int(steps.min()) + 1
    return max(1, -(-span // most))


def binned(df: pd.DataFrame, keys: list[str], values: list[str], per: int,
           span: tuple[int, int] | None = None) -> pd.DataFrame:
    """``df`` (a ``step`` column, ``keys``, ``values``) with each bin of ``per`` consecutive
    steps as one row per key: ``step`` the bin's first step, ``values`` the mean per step over
    the bin's steps. ``span``: the first and last step (default: ``df``'s), so that frames
    of the same figure bin alike."""
    if per <= 1 or df.empty:
        return df
    first, last = span or (int(df["step"].min()), int(df["step"].max()))
    out = df.assign(step=first + (df["step"] - first) // per * per)
    out = out.groupby(["step", *keys], as_index=False, observed=True)[values].sum()
    width = (last - out["step"] + 1).clip(upper=per)
    for v in values:
        out[v] = out[v] / width
    return out


def note(per: int) -> str:
    """What the subtitle says of the bars ('' when a bar is one step)."""
    return f"; each bar the mean of {per:,} steps" if per > 1 else ""
