"""Energy figures: power over time per device with the phases shaded underneath, and energy
and EDP across a sweep's configurations.

Pure functions of the tables :mod:`analyze.power` and :mod:`analyze.experiments.energy` give
(the phase colours are the other pages', from :mod:`reports.theme`).
"""

from __future__ import annotations

import duckdb
import pandas as pd
from plotnine import (
    aes,
    coord_flip,
    element_blank,
    element_text,
    facet_wrap,
    geom_col,
    geom_rect,
    geom_segment,
    geom_text,
    ggplot,
    labs,
    position_dodge,
    scale_color_manual,
    scale_fill_manual,
    scale_x_continuous,
    scale_y_continuous,
    theme,
)

from analyze import power as power_view
from analyze.views import RunLabel
from reports.page import Page
from reports.theme import BASE_SIZE, HEIGHT_IN, NOTE_COLOR, WIDTH_IN, phase_fill, theme_dltrace

SHADE_ALPHA = 0.35
ACTIVE_COLORS = {"active devices": "#0072B2", "incl. idle devices": "#999999"}
# Okabe-Ito black and reddish purple: apart from every phase colour shaded underneath
SOURCE_COLORS = {"counter": "#000000", "power readings": "#CC79A7"}


def power_over_time(power: pd.DataFrame, phases: pd.DataFrame, device: str, label: RunLabel,
                    note: str = "") -> ggplot:
    """One device's power over time (the mean between samples, a step line per source: its
    energy counter, its power readings), the phases of its rank shaded underneath.
    ``power``: source, start_s, end_s, power_w; ``phases``: rank, start_s, end_s, phase."""
    top = float(power["power_w"].max()) * 1.08 if len(power) else 1.0
    shades = phases.assign(ymin=0.0, ymax=top)
    rises = power.assign(next_w=power.groupby("source")["power_w"].shift(-1)).dropna(subset=["next_w"])
    ranks = sorted(set(phases["rank"]))
    whose = f"rank {ranks[0]}'s phases" if len(ranks) == 1 else "no steps"
    subtitle = f"{device}\nmean power between samples; shaded: {whose}"
    if note:
        subtitle += f"\n{note}"
    return (
        ggplot()
        + geom_rect(shades, aes(xmin="start_s", xmax="end_s", ymin="ymin", ymax="ymax", fill="phase"),
                    alpha=SHADE_ALPHA)
        + geom_segment(power, aes(x="start_s", xend="end_s", y="power_w", yend="power_w", color="source"),
                       size=0.7)
        + geom_segment(rises, aes(x="end_s", xend="end_s", y="power_w", yend="next_w", color="source"),
                       size=0.4)
        + phase_fill(list(dict.fromkeys(phases["phase"])))
        + scale_color_manual(values=SOURCE_COLORS, name="source")
        + scale_y_continuous(limits=(0, top), expand=(0, 0))
        + scale_x_continuous(expand=(0.01, 0))
        + labs(title=label.title(), subtitle=subtitle, x="time since the first step [s]", y="power [W]")
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, HEIGHT_IN + 0.4), legend_box="vertical")
    )


def run_pages(con: duckdb.DuckDBPyConnection, tag: str, label: RunLabel) -> list[Page]:
    """The power pages of one run (none without power): one per device."""
    if not power_view.available(con):
        return []
    power, phases, note = power_view.timeline(con)
    pages = []
    for i, device in enumerate(dict.fromkeys(power["device"])):
        pages.append(Page(f"{tag}-power-{i + 1}", power_over_time(
            power[power["device"] == device], phases[phases["device"] == device], device, label, note)))
    return pages


def sweep_energy(configs: pd.DataFrame) -> ggplot:
    """Per configuration: energy and EDP over its baseline's, over the active devices and
    including idle ones. ``configs``: the energy_configurations table."""
    order = list(dict.fromkeys(configs["config_label"]))
    scale, unit = (1e3, "kJ") if configs["energy_all_j"].max() >= 1e4 else (1.0, "J")
    rows = []
    for r in configs.itertuples():
        for which, energy, edp in (("active devices", r.energy_j, r.edp_norm),
                                   ("incl. idle devices", r.energy_all_j, r.edp_all_norm)):
            rows.append({"config": r.config_label, "which": which, "panel": f"energy [{unit}]", "value": energy / scale})
            rows.append({"config": r.config_label, "which": which, "panel": "EDP / baseline's", "value": edp})
    df = pd.DataFrame(rows)
    df["config"] = pd.Categorical(df["config"], categories=order[::-1])
    df["panel"] = pd.Categorical(df["panel"], categories=[f"energy [{unit}]", "EDP / baseline's"])
    df["text"] = df["value"].map(lambda v: "" if pd.isna(v) else f" {v:.3g}")
    dodge = position_dodge(width=0.8)
    base = configs["baseline"].iloc[0]
    base = "the fewest ranks" if base == "ranks" else base
    return (
        ggplot(df, aes("config", "value", fill="which"))
        + geom_col(position=dodge, width=0.75)
        + geom_text(aes(label="text"), position=dodge, ha="left", size=BASE_SIZE - 4, color=NOTE_COLOR)
        + facet_wrap("panel", scales="free_x", ncol=2)
        + coord_flip()
        + scale_fill_manual(values=ACTIVE_COLORS)
        + scale_y_continuous(expand=(0, 0, 0.3, 0))
        + labs(title="Energy and energy-delay product",
               subtitle=f"EDP = run time x energy, normalized to {base}; lower is better",
               y=None)
        + theme_dltrace()
        + theme(figure_size=(WIDTH_IN, max(HEIGHT_IN, 1.8 + 0.5 * len(order))), axis_title_y=element_blank(),
                axis_title_x=element_blank(), axis_text_y=element_text(size=BASE_SIZE - 2, ha="right"),
                legend_title=element_blank())
    )
