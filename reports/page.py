"""A page of a report: a figure and the name its PNG gets."""

from __future__ import annotations

from dataclasses import dataclass

from plotnine import ggplot


@dataclass
class Page:
    slug: str  # names the PNG: <pdf stem>-<slug>.png
    plot: ggplot
