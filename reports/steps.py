"""Per-step figures of long runs: at most :data:`MAX_BARS` bars a panel.

A bar per step is what a run of tens or hundreds of steps needs. A run of 10^5 steps would
draw millions of rectangles (a PDF no viewer opens, minutes to write), so consecutive steps
are grouped into bins of ``per`` steps and each bar is the bin's mean per step, drawn at the
bin's first step. The report bins in SQL (:class:`analyze.tables.steps.StepBins`) and hands
the figures its bins with ``per``; a frame of every step is binned here the same way. Steps
a frame has no row for (a step without idle time, a rank off the critical path) count as
zero, so the means are over every step of the bin.
"""

from __future__ import annotations

import pandas as pd
from plotnine import scale_x_continuous

from analyze.tables.steps import MAX_STEP_BARS, per_bin

MAX_BARS = MAX_STEP_BARS  # bars per panel before steps are binned (the views bin alike in SQL)


def steps_per_bar(steps: pd.Series, most: int = MAX_BARS) -> int:
    """How many consecutive steps one bar shows: 1 while the steps fit in ``most`` bars."""
    if steps.empty:
        return 1
    return per_bin(int(steps.max()) - int(steps.min()) + 1, most)


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
    """What the subtitle says of the bars, on a line of its own ('' when a bar is one step)."""
    return f"\neach bar: the mean of {per:,} consecutive steps" if per > 1 else ""


def width(per: int) -> float:
    """Bar width in steps: a bin's bars touch as a step's do."""
    return 0.85 * per


def step_label(v: float) -> str:
    """A step number on an axis: 250k, 1.5M from 10^4 on (long numbers run together)."""
    if abs(v) >= 1_000_000:
        return f"{v / 1e6:g}M"
    if abs(v) >= 10_000:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def axis(steps: pd.Series) -> scale_x_continuous:
    """The x axis of a per-step figure whose bars start at ``steps``: every step while there
    are few; whole steps, about 8 of them, up to 1,000 steps; beyond, plotnine's round breaks
    labelled short (250k). Never a half step."""
    values = sorted({int(v) for v in steps})
    if len(values) <= 12:
        return scale_x_continuous(breaks=values)
    span = values[-1] - values[0] + 1
    if span > 1000:
        return scale_x_continuous(labels=lambda breaks: [step_label(float(b)) for b in breaks])
    every = max(1, span // 8)
    return scale_x_continuous(breaks=lambda lim: [v for v in range(int(lim[0]), int(lim[1]) + 1)
                                                  if v % every == 0])


def prepared(df: pd.DataFrame, keys: list[str], values: list[str], per: int | None,
             span: tuple[int, int] | None = None) -> tuple[pd.DataFrame, int]:
    """(``df`` binned, steps a bar): ``per`` None: ``df`` has every step, bin it here; else
    it is binned already by ``per`` steps (:class:`analyze.tables.steps.StepBins`)."""
    if per is not None:
        return df, per
    per = steps_per_bar(df["step"] if span is None else pd.Series(span))
    return binned(df, keys, values, per, span), per
