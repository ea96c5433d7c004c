"""One look for every figure: the theme, the phase colours, the page size.

Figures are 5 inches wide with 11 pt text, so that a page scaled to a paper's column width
(about 3.3 inches) keeps text above 7 pt. Phase colours are from the Okabe-Ito palette, which
stays distinguishable under the common colour-vision deficiencies; idle (waiting) gets the
most alarming one. Every figure uses :func:`phase_fill`, so a phase has the same colour on
every page and in every report.
"""

from __future__ import annotations

from plotnine import (
    element_blank,
    element_line,
    element_text,
    guide_legend,
    guides,
    scale_fill_manual,
    theme,
    theme_bw,
)

WIDTH_IN = 5.0
HEIGHT_IN = 3.4
BASE_SIZE = 11
NOTE_COLOR = "#444444"

PHASE_ORDER = ["compute", "allreduce", "other_comm", "idle", "other"]
PHASE_COLORS = {
    "compute": "#0072B2",  # blue
    "allreduce": "#E69F00",  # orange
    "other_comm": "#009E73",  # bluish green
    "idle": "#D55E00",  # vermillion
    "other": "#999999",  # grey
}
# Short enough that all five fit in one legend row at 5 inches.
PHASE_LABELS = {
    "compute": "compute",
    "allreduce": "allreduce",
    "other_comm": "other comm.",
    "idle": "idle (wait)",
    "other": "other",
}


# The devices' phases (device_phases): compute as the host's compute, exposed communication as
# allreduce, hidden communication a lighter tint of it, idle as waiting.
DEVICE_PHASE_ORDER = ["compute", "comm_hidden", "comm_exposed", "memory", "idle"]
DEVICE_PHASE_COLORS = {
    "compute": PHASE_COLORS["compute"],
    "comm_hidden": "#F5CC7F",  # orange tint: communication under compute
    "comm_exposed": PHASE_COLORS["allreduce"],
    "memory": "#CC79A7",  # reddish purple
    "idle": PHASE_COLORS["idle"],
}
DEVICE_PHASE_LABELS = {"compute": "compute", "comm_hidden": "comm. hidden", "comm_exposed": "comm. exposed",
                       "memory": "memory", "idle": "idle"}


# The timeline's lanes under each rank: regions of the main thread, communication lanes and
# accelerator streams.
# Okabe-Ito colours the phases leave free, and light tints for waits and user regions; on the
# communication lanes a collective has its phase's colour and its waiting the idle colour.
LANE_ORDER = ["dataloader", "forward", "backward", "optimizer", "wait", "user", "memory", "waiting"]
LANE_COLORS = {
    "dataloader": "#F0E442",  # yellow
    "forward": "#56B4E9",  # sky blue
    "backward": "#CC79A7",  # reddish purple
    "optimizer": "#000000",  # black
    "wait": "#EAAE7F",  # vermillion tint: the main thread waits for communication
    "user": "#BBBBBB",  # light grey
    # an accelerator stream's copies and sets (its kernels are compute, its collectives
    # allreduce or other comm.): a dark shade of the backward pass's reddish purple
    "memory": "#7A3F66",
    "waiting": PHASE_COLORS["idle"],
}
LANE_LABELS = {
    "dataloader": "data loading", "forward": "forward", "backward": "backward",
    "optimizer": "optimizer", "wait": "wait region", "user": "user region",
    "memory": "device copy/set", "waiting": "lane waiting",
}


def timeline_fill(present: list[str]) -> list:
    """One fill scale for the phases and the lanes (phases first), listing what is present."""
    breaks = [p for p in PHASE_ORDER + LANE_ORDER if p in present]
    labels = {**PHASE_LABELS, **LANE_LABELS}
    return [
        scale_fill_manual(values={**PHASE_COLORS, **LANE_COLORS}, breaks=breaks,
                          labels=[labels[b] for b in breaks], name="phase", drop=False),
        guides(fill=guide_legend(ncol=min(4, len(breaks)), byrow=True)),
    ]


# Hosts' and devices' phases in one figure: they share compute and idle (the same colours).
BOTH_PHASE_ORDER = PHASE_ORDER + [p for p in DEVICE_PHASE_ORDER if p not in PHASE_ORDER]


def phase_fill(present: list[str] | None = None, device: bool = False, both: bool = False) -> list:
    """The phase fill scale and its one-row legend; ``present`` limits the legend to the
    phases that occur (the colours never change). ``device``: the devices' phases; ``both``:
    the hosts' and the devices' (idle is then just "idle": a device's idle is not a wait)."""
    if both:
        order, colors = BOTH_PHASE_ORDER, {**DEVICE_PHASE_COLORS, **PHASE_COLORS}
        labels = {**PHASE_LABELS, **DEVICE_PHASE_LABELS}
    else:
        order, colors, labels = ((DEVICE_PHASE_ORDER, DEVICE_PHASE_COLORS, DEVICE_PHASE_LABELS) if device
                                 else (PHASE_ORDER, PHASE_COLORS, PHASE_LABELS))
    breaks = [p for p in order if present is None or p in present]
    return [
        scale_fill_manual(values=colors, breaks=breaks, labels=[labels[p] for p in breaks],
                          name="phase", drop=False),
        guides(fill=guide_legend(nrow=2 if both and len(breaks) > 3 else 1)),
    ]


def theme_dltrace() -> theme:
    return theme_bw(base_size=BASE_SIZE) + theme(
        figure_size=(WIDTH_IN, HEIGHT_IN),
        legend_position="bottom",  # never over the data
        legend_title=element_blank(),
        legend_key_size=9,
        legend_key_spacing_x=4,
        legend_text=element_text(size=BASE_SIZE - 2),
        plot_title=element_text(size=BASE_SIZE + 1, ha="left"),
        plot_title_position="plot",  # from the figure's left edge: long y labels do not push it off
        plot_subtitle=element_text(size=BASE_SIZE - 2, ha="left", color=NOTE_COLOR),
        panel_grid_minor=element_blank(),
        panel_grid_major=element_line(color="#e5e5e5", size=0.4),
        strip_background=element_blank(),
        strip_text=element_text(size=BASE_SIZE - 1, ha="left"),
    )
