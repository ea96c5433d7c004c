"""Pages on why a step is slow: overlap, root causes of idle time, critical path, and a diff.

Pure builders over the frames of :mod:`analyze.tables.causes.views` and the table of
:mod:`analyze.experiments.diff`; :func:`run_pages` picks the pages a run has data for.
"""

from __future__ import annotations

import textwrap

import duckdb
import pandas as pd
from plotnine import (
    aes,
    element_blank,
    element_text,
    facet_wrap,
    geom_col,
    geom_errorbarh,
    geom_point,
    geom_vline,
    ggplot,
    guide_legend,
    guides,
    labs,
    scale_color_manual,
    scale_fill_manual,
    scale_y_continuous,
    theme,
)

from analyze.tables.causes import device as device_waits
from analyze.tables.causes import views as cause_views
from analyze.tables.names import cut_middle, short_names
from analyze.tables.steps import RankGroups, StepBins, rank_groups, step_bins
from analyze.views import RunLabel
from reports import steps as per_bar
from reports.page import Page
from reports.theme import BASE_SIZE, HEIGHT_IN, PHASE_COLORS, WIDTH_IN, theme_dltrace

# Okabe-Ito, in an order that keeps neighbours apart; causes and ranks take them in turn.
QUALITATIVE = ["#E69F00", "#56B4E9", "#009E73", "#CC79A7", "#0072B2", "#D55E00", "#F0E442", "#000000"]
OTHER_COLOR = "#BBBBBB"
KIND_COLORS = {"phase": PHASE_COLORS["compute"], "region": "#CC79A7", "collective": PHASE_COLORS["allreduce"],
               "device": "#56B4E9", "kernel": "#000000"}


def _palette(levels: list[str], other: str | None = None) -> dict[str, str]:
    out = {lv: QUALITATIVE[i % len(QUALITATIVE)] for i, lv in enumerate(x for x in levels if x != other)}
    if other is not None:
        out[other] = OTHER_COLOR
    return out


def rank_palette(figures: list[list[str]], other: str = "other ranks") -> dict[str, str]:
    """One colour per rank label ("rank 7") across a run's pages, so that a rank looks the same on
    each: ``figures`` are the labels each page shows, in the order of the pages. Labels are
    coloured in the order they first appear, each with the first colour no label it shares a
    page with has (the colours repeat past eight such labels); ``other`` is grey."""
    out: dict[str, str] = {other: OTHER_COLOR}
    pages: dict[str, list[int]] = {}
    for i, labels in enumerate(figures):
        for lv in labels:
            pages.setdefault(lv, []).append(i)
    for lv, on in pages.items():
        if lv in out:
            continue
        near = {out[x] for i in on for x in figures[i] if x in out and x != other}
        out[lv] = next((c for c in QUALITATIVE if c not in near), QUALITATIVE[len(near) % len(QUALITATIVE)])
    return out


def _facet_height(panels: int, cols: int) -> float:
    return min(9.0, HEIGHT_IN + 1.6 * (-(-panels // cols) - 1))


def overlap(steps: pd.DataFrame, summary: pd.DataFrame, label: RunLabel, per: int | None = None,
            groups: RankGroups | None = None) -> ggplot:
    """Per rank, each step's communication split into the part compute hid and the exposed
    part. ``steps``: rank, step, part (hidden, exposed), ms; ``summary``: rank, kind, overlap
    (the overlap_summary table), for the subtitle."""
    df, per = per_bar.prepared(steps, ["rank", "part"], ["ms"], per)
    df = df.assign(part=pd.Categorical(df["part"], categories=["exposed", "hidden"]))
    ratios = summary[summary["kind"] == "all"]
    groups = groups or RankGroups(1, 0)  # with groups, "rank" is a group's first rank
    shares = ratios["overlap"].dropna()
    if len(shares) > 4:  # a sentence per rank would not fit
        said = f"{100 * shares.min():.0f}-{100 * shares.max():.0f}% by rank (median {100 * shares.median():.0f}%)"
    else:
        said = ", ".join(f"rank {r}: {100 * v:.0f}%" for r, v in zip(ratios["rank"], ratios["overlap"], strict=True)
                         if pd.notna(v))
    n = df["rank"].nunique()
    cols = min(4, n)
    return (
        ggplot(df, aes("step", "ms", fill="part"))
        + geom_col(width=per_bar.width(per))
        + facet_wrap("rank", labeller=lambda r: groups.panel(int(r)), ncol=cols)  # type: ignore[arg-type]
        + per_bar.axis(df["step"])
        + scale_fill_manual(values={"hidden": PHASE_COLORS["compute"], "exposed": PHASE_COLORS["allreduce"]},
                            breaks=["hidden", "exposed"],
                            labels=["hidden under compute", "exposed (communication, idle)"])
        + scale_y_continuous(expand=(0, 0, 0.05, 0))
        + labs(title=label.title(), subtitle="communication per step, all lanes"
               + (f"; hidden over the run:\n{said}" if said else "")  # a line of its own, to fit the page
               + per_bar.note(per) + groups.note(), x="step",
               y="communication [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, _facet_height(n, cols)))
    )


def root_causes(per_step: pd.DataFrame, lines: list[str], label: RunLabel, per: int | None = None) -> ggplot:
    """Idle time per step, summed over the ranks that waited, coloured by its cause (the rank
    that arrived last and the region that made it late). ``per_step``: step, cause, ms;
    ``lines``: the largest causes in words, for the subtitle."""
    return _cause_bars(per_step, lines, label, per, "idle time per step by its cause: the late rank and the region\n"
                       "that made it late", "idle, all ranks [ms]")


def device_causes(per_step: pd.DataFrame, lines: list[str], label: RunLabel, per: int | None = None,
                  colors: dict[str, str] | None = None) -> ggplot:
    """On the accelerators: the waiting in collective kernels per step, summed over the ranks
    that waited, coloured by the rank whose kernel started last (:func:`analyze.tables.causes.
    device.device_wait_steps`); ``lines``: the largest in words; ``colors``: the run's
    :func:`rank_palette`, if given."""
    return _cause_bars(per_step, lines, label, per, "waiting in collective kernels per step on the devices,\n"
                       "by the rank whose kernel started last", "waiting, all devices [ms]", colors)


def cause_levels(per_step: pd.DataFrame) -> list[str]:
    """The causes a cause page shows, in its legend's order."""
    return [str(c) for c in per_step["cause"].cat.categories] if hasattr(per_step["cause"], "cat") else \
        list(dict.fromkeys(per_step["cause"]))


def _cause_bars(per_step: pd.DataFrame, lines: list[str], label: RunLabel, per: int | None, subtitle: str,
                y: str, colors: dict[str, str] | None = None) -> ggplot:
    causes = cause_levels(per_step)
    other = next((c for c in ("other causes", "other ranks") if c in causes), None)
    colors = colors or _palette(causes, other)
    top = textwrap.fill(lines[0], 78) if lines else ""
    per_step, per = per_bar.prepared(per_step, ["cause"], ["ms"], per)
    return (
        ggplot(per_step, aes("step", "ms", fill="cause"))
        + geom_col(width=per_bar.width(per))
        + scale_fill_manual(values=colors, breaks=causes)
        + per_bar.axis(per_step["step"])
        + guides(fill=guide_legend(ncol=2))
        + scale_y_continuous(expand=(0, 0, 0.05, 0))
        + labs(title=label.title(), subtitle=subtitle + per_bar.note(per) + (f"; the largest:\n{top}" if top else ""),
               x="step", y=y)
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, HEIGHT_IN + 0.9), plot_subtitle=element_text(size=BASE_SIZE - 3))
    )


def path_levels(per_rank: pd.DataFrame, most: int = 7) -> list[str]:
    """The ranks a critical-path page shows (the ``most`` with the most time on the path, by
    number), then "other ranks" if there are more."""
    busiest = per_rank.groupby("rank")["ms"].sum().sort_values(ascending=False).index[:most]
    grouped = len(busiest) < per_rank["rank"].nunique()
    return [f"rank {r}" for r in sorted(busiest)] + (["other ranks"] if grouped else [])


def critical_path(per_rank: pd.DataFrame, steps: pd.DataFrame, label: RunLabel, most: int = 7,
                  per: int | None = None, colors: dict[str, str] | None = None) -> ggplot:
    """Per step, the critical path's length split by the rank it ran on, and the step time
    perfect balance would give (black points). ``per_rank``: step, rank, ms; ``steps``: step,
    path_ms, balanced_ms; without balanced_ms (the accelerators' path,
    :func:`analyze.tables.causes.views.device_path_steps`), the path alone. Ranks past the
    ``most`` most often on the path are grouped; ``colors``: the run's :func:`rank_palette`,
    if given."""
    levels = path_levels(per_rank, most)
    grouped = levels[-1:] == ["other ranks"]
    who = per_rank["rank"].map({r: f"rank {r}" for r in per_rank["rank"].unique()})
    who = who.where(who.isin(levels), "other ranks")
    df = per_rank.assign(who=pd.Categorical(who, categories=levels[::-1]))
    n = steps.get("n", 1)  # steps a row stands for (binned by the view)
    total = float((steps["path_ms"] * n).sum())
    span = (int(steps["step"].min()), int(steps["step"].max())) if len(steps) and per is None else None
    df, bar = per_bar.prepared(df, ["who"], ["ms"], per, span)
    plot = ggplot(df, aes("step", "ms", fill="who")) + geom_col(width=per_bar.width(bar))
    if "balanced_ms" in steps:
        cost = total - float((steps["balanced_ms"] * n).sum())
        steps, _ = per_bar.prepared(steps[["step", "path_ms", "balanced_ms"]], [], ["path_ms", "balanced_ms"],
                                    per, span)
        plot += geom_point(steps, aes("step", "balanced_ms"), inherit_aes=False, shape="D", size=1.8, color="black")
        subtitle = (f"critical path per step by the rank it runs on;\nblack: the step time perfect balance would "
                    f"give;\nimbalance cost {cost:,.1f} of {total:,.1f} ms ({100 * cost / total if total else 0:.1f}%)")
    else:
        subtitle = ("the accelerators' critical path per step by the rank it runs on,\nwalked back through the "
                    f"waits inside collective kernels;\n{total:,.1f} ms in all")
    return (
        plot
        + scale_fill_manual(values=colors or _palette(levels, "other ranks" if grouped else None), breaks=levels)
        + per_bar.axis(df["step"])
        + scale_y_continuous(expand=(0, 0, 0.05, 0))
        + labs(title=label.title(), subtitle=subtitle + per_bar.note(bar), x="step", y="critical path [ms]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, HEIGHT_IN + 0.3))
    )


def diff_page(table: pd.DataFrame, a: str, b: str, top: int = 15) -> Page:
    """The diff of B against A: the ``top`` largest changes with their 95% intervals."""
    return Page("diff", diff_plot(table, a, b, top))


def _axis_labels(kinds: list[str], names: list[str], width: int = 32) -> list[str]:
    """``kind: name`` in at most two lines of ``width`` characters, so that kernels' C++ names
    leave the plot its width: shortened apart (:func:`analyze.tables.names.short_names`: the
    template instances of one kernel keep their arguments), broken after an underscore or a
    space where one comes early enough, a second line too long cut in its middle (its end is
    what tells template instances, and their numbers, apart)."""
    out = []
    # room for the kind and for a break before the width (a line rarely breaks much earlier)
    for kind, short in zip(kinds, short_names(names, 2 * width - len("collective: ") - 8), strict=True):
        text = f"{kind}: {short}"
        if len(text) > width:
            cut = text.rfind("_", 0, width) + 1 or text.rfind(" ", 0, width) + 1 or width
            first, rest = text[:cut].rstrip(), text[cut:].lstrip()
            text = first + "\n" + cut_middle(rest, width)
        out.append(text)
    return out


def diff_plot(table: pd.DataFrame, a: str, b: str, top: int = 15) -> ggplot:
    df = table[table["delta_ms"].abs() > 0].head(top).copy()
    items = _axis_labels(list(df["kind"]), list(df["name"]))
    seen: dict[str, int] = {}
    for i, item in enumerate(items):  # alike after the line break's cut: numbered
        seen[item] = seen.get(item, 0) + 1
        items[i] = item if seen[item] == 1 else f"{item} #{seen[item]}"
    df["item"] = pd.Categorical(items, categories=items[::-1])
    lines = sum(item.count("\n") for item in items)  # a wrapped label's second lines
    df["lo"] = df["ci_low"].fillna(df["delta_ms"])
    df["hi"] = df["ci_high"].fillna(df["delta_ms"])
    over = table["over"].iloc[0] if len(table) else "steps"
    return (
        ggplot(df, aes(y="item"))
        + geom_vline(xintercept=0, color="#999999", size=0.4)
        + geom_errorbarh(aes(xmin="lo", xmax="hi", color="kind"), height=0.35)
        + geom_point(aes(x="delta_ms", color="kind"), size=2)
        + scale_color_manual(values=KIND_COLORS, breaks=[k for k in KIND_COLORS if k in set(df["kind"])])
        + labs(title=f"{b} against {a}",
               subtitle=f"change in time per step (mean over ranks), largest first;\n"
                        f"95% confidence intervals over {over}",
               x="change per step [ms]", y=None)
        + theme_dltrace()
        + guides(color=guide_legend(ncol=3, title=""))
        + theme(figure_size=(WIDTH_IN, max(HEIGHT_IN, 1.6 + 0.26 * len(df) + 0.14 * lines)),
                axis_title_y=element_blank(), axis_text_y=element_text(size=BASE_SIZE - 2))
    )


def run_pages(con: duckdb.DuckDBPyConnection, tag: str, label: RunLabel, bins: StepBins | None = None,
              groups: RankGroups | None = None) -> list[Page]:
    """The pages a run has data for: overlap (it communicates), root causes (some rank was
    idle), device causes (a collective kernel waited for another rank's), critical path (more
    than one rank), the accelerators' critical path (more than one rank, and waits inside
    collective kernels). ``bins``: the run's steps binned in SQL for
    the per-step bars (:func:`analyze.tables.steps.step_bins`)."""
    bins, groups = bins or step_bins(con), groups or rank_groups(con)
    pages = []
    steps = cause_views.overlap_steps(con, bins, groups)
    if steps["ms"].sum() > 0:
        pages.append(Page(f"{tag}-overlap", overlap(steps, cause_views.overlap_summary(con), label, bins.per, groups)))
    per_step = cause_views.cause_steps(con, bins=bins)
    if len(per_step) and per_step["ms"].sum() > 0:
        pages.append(Page(f"{tag}-causes", root_causes(per_step, cause_views.delay_lines(con, 2), label, bins.per)))
    inst = device_waits.device_wait_instances(con)
    device = device_waits.device_wait_steps(con, bins=bins, inst=inst)
    show_device = len(device) and device["ms"].sum() > 0
    per_rank, balance = cause_views.path_steps(con, bins)
    show_path = label.ranks > 1 and len(balance)
    on_devices, lengths = cause_views.device_path_steps(con, bins)
    show_device_path = label.ranks > 1 and len(lengths)
    # a rank has one colour on the pages that colour ranks
    colors = rank_palette([cause_levels(device) if show_device else [], path_levels(per_rank) if show_path else [],
                           path_levels(on_devices) if show_device_path else []])
    if show_device:
        lines = cause_views.device_wait_lines(con, 1, parts=1, inst=inst)
        pages.append(Page(f"{tag}-device-causes", device_causes(device, lines, label, bins.per, colors)))
    if show_path:
        pages.append(Page(f"{tag}-critical-path", critical_path(per_rank, balance, label, per=bins.per, colors=colors)))
    if show_device_path:
        pages.append(Page(f"{tag}-device-critical-path", critical_path(on_devices, lengths, label, per=bins.per,
                                                                       colors=colors)))
    return pages
