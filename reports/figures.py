"""The figure builders: each takes tables from :mod:`analyze.views` and returns a ggplot.

Pure functions: no database access, no arithmetic on the trace beyond placing labels.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from plotnine import (
    aes,
    coord_flip,
    element_blank,
    element_text,
    facet_wrap,
    geom_boxplot,
    geom_col,
    geom_jitter,
    geom_rect,
    geom_segment,
    geom_text,
    ggplot,
    labs,
    scale_color_manual,
    scale_x_continuous,
    scale_y_continuous,
    scale_y_reverse,
    theme,
)

from analyze.tables.steps import RankGroups
from analyze.views import RunLabel, Timeline
from reports import steps as per_bar
from reports.theme import (
    BASE_SIZE,
    BOTH_PHASE_ORDER,
    DEVICE_PHASE_ORDER,
    HEIGHT_IN,
    PHASE_COLORS,
    PHASE_ORDER,
    WIDTH_IN,
    phase_fill,
    theme_dltrace,
    timeline_fill,
)


def present_phases(phases: pd.Series, amounts: pd.Series | None = None,
                   order: list[str] = PHASE_ORDER) -> list[str]:
    """Phases that occur (with a non-zero amount, when ``amounts`` is given), in legend order."""
    seen = phases.astype(str) if amounts is None else phases[amounts > 0].astype(str)
    return [p for p in order if p in set(seen)]


RASTER_BARS = 5_000  # a timeline with more phase bars draws them as an image
MAX_Y_LABELS = 48  # y labels a timeline's 9 inches hold apart at 9 pt; more rows: every k-th
# rank named, lanes unnamed (their colours and the legend still tell them apart)


def timeline_rows(tl: Timeline) -> tuple[dict[tuple[int, int], float], list[float], list[str]]:
    """Where each row goes: (rank, lane) -> y (lane 0: the rank's phases), and the y axis'
    breaks and labels. Without lanes, rank r is at y = r. Above :data:`MAX_Y_LABELS` rows,
    only every k-th rank is labelled (k 1, 2, 5, 10, 20, ...; lanes unlabelled), so that the
    labels do not run together; every row is still drawn."""
    ranks = sorted(tl.steps["rank"].unique())
    lanes = tl.lanes if tl.lanes is not None and len(tl.lanes) else None
    pos: dict[tuple[int, int], float] = {}
    rows: list[tuple[float, str, bool]] = []  # y, label, a rank's own row
    rank_lanes: dict[int, list[tuple[int, str]]] = {}  # each rank's lanes, in order, with their labels
    if lanes is not None:
        firsts = lanes[lanes["part"] != "wait"].drop_duplicates(["rank", "lane"]).sort_values(
            ["rank", "lane"], kind="stable")
        for r, lane, text in firsts[["rank", "lane", "label"]].itertuples(index=False):
            rank_lanes.setdefault(int(r), []).append((int(lane), str(text)))
    y = 0.0
    for r in ranks:
        y = float(r) if lanes is None else y
        pos[(r, 0)] = y
        rows.append((y, f"rank {r}", True))
        if lanes is not None:
            for lane, text in rank_lanes.get(int(r), []):
                y += 0.8
                pos[(r, lane)] = y
                rows.append((y, text, False))
            y += 1.4  # a gap before the next rank
    if len(rows) > MAX_Y_LABELS:
        every = labelled_every(len(ranks))
        rows = [row for row in rows if row[2]][::every]
    return pos, [y for y, _, _ in rows], [text for _, text, _ in rows]


def labelled_every(ranks: int, most: int = MAX_Y_LABELS) -> int:
    """Label every k-th of ``ranks`` rows, k the smallest of 1, 2, 5, 10, 20, 50, ... that
    leaves at most ``most`` labels."""
    k = 1
    while -(-ranks // k) > most:
        k = k * 5 // 2 if str(k)[0] == "2" else k * 2
    return k


def timeline(tl: Timeline, label: RunLabel) -> ggplot:
    """Gantt chart: a row per rank, phase intervals along time, step starts marked; under each
    rank, when the timeline has lanes, its regions (data loading, forward, backward,
    optimizer, waits) and its communication lanes (each bucket or background reduction, its
    waiting for the last rank in the idle colour)."""
    ranks = sorted(tl.steps["rank"].unique())
    pos, breaks, tick_labels = timeline_rows(tl)
    y = tl.bars["rank"].map(lambda r: pos[(r, 0)])
    bars = tl.bars.assign(ymin=y - 0.4, ymax=y + 0.4)
    bottom: dict[int, float] = {}  # each rank's last row
    for (r, _), v in pos.items():
        bottom[r] = max(v, bottom.get(r, v))
    marks = tl.steps.assign(y0=tl.steps["rank"].map(lambda r: pos[(r, 0)]) - 0.47,
                            y1=tl.steps["rank"].map(bottom) + 0.47)
    first = tl.steps[tl.steps["rank"] == ranks[0]]
    top = pos[(ranks[0], 0)]
    tags = first.assign(x=first["start_ms"], y=top - 0.55, text="step " + first["step"].astype(str))
    a, b = tl.window
    shown = f"step {a}" if b - a == 1 else f"steps {a}–{b - 1}"
    subtitle = f"{shown}; black ticks: step starts; white: outside any step"
    if tl.note:
        subtitle += f"\n{tl.note}"
    present = present_phases(tl.bars["phase"])
    # many bars are drawn as an image in the PDF (at the report's PNG resolution; labels stay
    # text): 24,625 rectangles took 3.2 s to write, and as long in a viewer at every redraw
    layers = [geom_rect(bars, aes(xmin="start_ms", xmax="end_ms", ymin="ymin", ymax="ymax", fill="phase"),
                        raster=len(bars) > RASTER_BARS)]
    if tl.lanes is not None and len(tl.lanes):
        ly = pd.Series([pos[(r, la)] for r, la in zip(tl.lanes["rank"], tl.lanes["lane"], strict=True)],
                       index=tl.lanes.index)
        half = tl.lanes["part"].map({"wait": 0.14}).fillna(0.3)
        lanes = tl.lanes.assign(ymin=ly - half, ymax=ly + half)
        on_device = lanes["part"] == "device"
        rect = aes(xmin="start_ms", xmax="end_ms", ymin="ymin", ymax="ymax", fill="fill")
        layers.append(geom_rect(lanes[~on_device], rect, color="white", size=0.1))
        if on_device.any():  # no outline: a stream's short kernels would be mostly outline, paler than their colour
            layers.append(geom_rect(lanes[on_device], rect))
        present = present + [f for f in dict.fromkeys(tl.lanes["fill"]) if f not in present]
        fill = timeline_fill(present)
        small_labels = theme(axis_text_y=element_text(size=BASE_SIZE - 2))
    else:
        fill = phase_fill(present)
        small_labels = theme()
    lo, hi = min(pos.values()), max(pos.values())  # every row, labelled or not
    span = hi - lo
    height = min(9.0, max(HEIGHT_IN - 0.6, 2.0 + 0.32 * span * (1 if tl.lanes is None else 0.9)))
    plot = ggplot()
    for layer in layers:
        plot = plot + layer
    return (
        plot
        + geom_segment(marks, aes(x="start_ms", xend="start_ms", y="y0", yend="y1"), size=0.6, color="black")
        + geom_text(tags, aes(x="x", y="y", label="text"), size=BASE_SIZE - 3, ha="left", va="bottom")
        + fill
        + scale_y_reverse(breaks=breaks, labels=tick_labels, limits=(hi + 0.6, lo - 0.95))
        + scale_x_continuous(expand=(0.01, 0))
        + labs(title=label.title(), subtitle=subtitle, x=f"time since the start of step {a} [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, height), panel_grid_major_y=element_blank(),
                axis_ticks_major_y=element_blank(), axis_title_y=element_blank())
        + small_labels
    )


def step_breakdown(steps: pd.DataFrame, label: RunLabel, per: int | None = None,
                   groups: RankGroups | None = None, device: bool = False) -> ggplot:
    """Per rank, each step's time stacked by phase: warm-up, drift and stragglers show up.
    ``per``: ``steps`` is binned already, by so many steps (reports/steps.py); ``groups``: its
    ranks are groups of ranks (a panel each). ``device``: the phases are the devices'
    (``device_phases``: compute, communication hidden or exposed, memory, idle)."""
    groups = groups or RankGroups(1, 0)
    order = DEVICE_PHASE_ORDER if device else PHASE_ORDER
    df, per = per_bar.prepared(steps, ["rank", "phase"], ["ms"], per)
    df = df.assign(phase=pd.Categorical(df["phase"], categories=order[::-1]))
    n_ranks = df["rank"].nunique()
    cols = min(4, n_ranks)
    rows = -(-n_ranks // cols)
    what = ("on the devices (all of a rank's streams): time per step by device phase;\n"
            if device else "time per step by phase; ")
    return (
        ggplot(df, aes("step", "ms", fill="phase"))  # type: ignore[operator]
        + geom_col(width=per_bar.width(per))
        + facet_wrap("rank", labeller=lambda r: groups.panel(int(r)), ncol=cols)  # type: ignore[arg-type]
        + per_bar.axis(df["step"])
        + phase_fill(present_phases(df["phase"], df["ms"], order), device)
        + scale_y_continuous(expand=(0, 0, 0.05, 0))
        + labs(title=label.title(), subtitle=f"{what}step 0 is usually warm-up" + per_bar.note(per)
               + groups.note(),
               x="step", y="time [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, min(9.0, HEIGHT_IN + 1.6 * (rows - 1))))
    )


def bottleneck(runs: pd.DataFrame) -> ggplot:
    """One bar per run: mean steady-state step time split by phase, runs side by side.

    ``runs``: run (a label, several lines allowed), phase, ms; runs keep their order of first
    appearance, top to bottom. With a ``side`` column, a run with rows of both sides
    (``hosts``, and ``accelerators`` for GPU traces: the devices' phases) gets a bar for each.
    """
    sides = runs["side"] if "side" in runs else pd.Series("hosts", index=runs.index)
    both = runs["run"].where(sides == "accelerators").dropna().unique()
    runs = runs.assign(run=np.where(runs["run"].isin(both), runs["run"] + "\n" + sides, runs["run"]))
    order = list(dict.fromkeys(runs["run"]))
    phase_order = BOTH_PHASE_ORDER if len(both) else PHASE_ORDER
    df = runs.assign(run=pd.Categorical(runs["run"], categories=order[::-1]),
                     phase=pd.Categorical(runs["phase"], categories=phase_order[::-1]))
    totals = df.groupby("run", observed=True)["ms"].sum().reset_index()
    totals["text"] = totals["ms"].map(lambda v: f" {v:.1f} ms")
    height = max(2.6, 1.6 + 0.6 * len(order))
    return (
        ggplot(df, aes("run", "ms", fill="phase"))
        + geom_col(width=0.7)
        + geom_text(totals, aes("run", "ms", label="text"), inherit_aes=False, ha="left",
                    size=BASE_SIZE - 2)
        + coord_flip()
        + phase_fill(present_phases(df["phase"], df["ms"], phase_order), both=len(both) > 0)
        + scale_y_continuous(expand=(0, 0, 0.28, 0))
        + labs(title="Where a training step's time goes",
               subtitle="mean over steady-state steps and ranks"
               + ("; hosts and accelerators" if len(both) else ""),
               y="time per step [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, height), axis_title_y=element_blank(),
                axis_text_y=element_text(size=BASE_SIZE - 2, ha="right"))
    )


MAX_POINTS = 2000  # points of each op in the waits figure (the boxes use every instance)
MAX_BOXES = 8  # boxes of each op side by side before consecutive ranks share one


def _from_zero(limits: tuple[float, float]) -> tuple[float, float]:
    """A panel's y limits from 0, and at least 1 (ms) high when everything in it is 0."""
    return 0.0, limits[1] if limits[1] > 0 else 1.0


def _boxes(waits: pd.DataFrame) -> pd.DataFrame:
    """op, rank, n, lower, middle, upper (quartiles), ymin, ymax (Tukey's whiskers: the most
    extreme waits within 1.5 IQR of the box) of each op's and rank's waits (in SQL for the
    report: :func:`analyze.views.waits_summary`)."""
    rows = []
    for (op, rank), g in waits.groupby(["op", "rank"], sort=True):
        y = g["wait_ms"].to_numpy(float)
        y = y[~np.isnan(y)]  # an instance never matched across ranks has no wait
        if not len(y):
            continue
        q1, med, q3 = np.percentile(y, [25, 50, 75])
        reach = 1.5 * (q3 - q1)
        rows.append({"op": op, "rank": rank, "n": len(y), "lower": q1, "middle": med, "upper": q3,
                     "ymin": y[y >= q1 - reach].min(), "ymax": y[y <= q3 + reach].max()})
    return pd.DataFrame(rows, columns=["op", "rank", "n", "lower", "middle", "upper", "ymin", "ymax"])


def collective_waits(waits: pd.DataFrame, stragglers: pd.DataFrame, label: RunLabel,
                     boxes: pd.DataFrame | None = None, groups: RankGroups | None = None) -> ggplot:
    """Per collective op and rank: the wait before each collective instance (box and points,
    the rank everyone waited for in vermillion), and how often each rank arrived last.

    ``waits``: op, rank, wait_ms, arrived_last; ``stragglers``: op, rank, times_last, instances.
    """
    groups = groups or RankGroups(1, 0)  # with groups, "rank" is a group's first rank
    crowded = stragglers.groupby("op").size().max() > 4 if len(stragglers) else False
    last = "" if crowded else "last "  # many boxes: the subtitle says what the counts are
    ticks = pd.DataFrame({"op": stragglers["op"], "rank": stragglers["rank"],
                          "x": [f"{groups.label(int(r.rank), short=True)}\n{last}{r.times_last:,}/{r.instances:,}"
                                for r in stragglers.itertuples()]})

    def with_x(df: pd.DataFrame) -> pd.DataFrame:
        out = df.merge(ticks, on=["op", "rank"], how="left")
        out["x"] = out["x"].fillna("rank " + out["rank"].astype(str))
        return out

    w = waits[["op", "rank", "wait_ms", "arrived_last"]]
    # the boxes summarize every instance, computed here or in SQL (a long run's millions of
    # instances took plotnine's stat 34 s); the points are a sample of them
    if boxes is None:
        boxes = _boxes(w)
        shown = w.assign(key=np.random.default_rng(0).random(len(w)))
        shown = shown[shown.groupby("op")["key"].rank(method="first") <= MAX_POINTS]
    else:  # waits is the sample already (analyze.views.waits_summary)
        shown = w
    sampled = (f"\npoints: a sample of {MAX_POINTS:,} instances per op; boxes: all"
               if (boxes.groupby("op")["n"].sum() > MAX_POINTS).any() else "")
    boxes = with_x(boxes)
    shown = with_x(shown)
    # in rank order (as text, "512-1023" came after "3584-4095")
    order = pd.unique(pd.concat([boxes, shown]).sort_values("rank", kind="stable")["x"])
    boxes["x"], shown["x"] = (pd.Categorical(df["x"], categories=order) for df in (boxes, shown))
    shown["who"] = shown["arrived_last"].map({True: "arrived last", False: "waited"})
    ops = w["op"].nunique()
    return (
        ggplot(shown, aes("x", "wait_ms"))
        + geom_boxplot(boxes, aes("x", lower="lower", middle="middle", upper="upper", ymin="ymin", ymax="ymax"),
                       stat="identity", inherit_aes=False, width=0.5, color="#555555")
        # seeded, so the same run draws the same figure (plotnine takes a seed of 0 for none)
        + geom_jitter(aes(color="who"), width=0.18, height=0, random_state=1, size=1.2, alpha=0.8)
        + facet_wrap("op", scales="free", ncol=min(2, ops))
        # waits are never negative: an op nobody waited in (a broadcast, whose root is unknown)
        # has its zeros at the bottom, not in the middle of an axis from -0.5 to 0.5
        + scale_y_continuous(limits=_from_zero)
        + scale_color_manual(values={"arrived last": PHASE_COLORS["idle"], "waited": PHASE_COLORS["compute"]})
        + labs(title=label.title(),
               subtitle="wait for the last rank, per instance; under x: times last, of the instances" + sampled
               + (f"\neach box: the instances of {groups.per} consecutive ranks (under it)" if groups.per > 1 else ""),
               x=None, y="wait [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, HEIGHT_IN + 1.4 * ((ops - 1) // 2)),
                axis_title_x=element_blank(), legend_title=element_blank())
        # many boxes: smaller ticks; four-digit ranges ("1024-1535") smaller still, or they touch
        + (theme(axis_text_x=element_text(size=BASE_SIZE - (4 if groups.per > 1 and groups.ranks > 1000 else 3)))
           if crowded else theme())
    )
