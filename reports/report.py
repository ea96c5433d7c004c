"""``analyze report``: every figure of one or more runs, as a multi-page PDF (and PNGs).

Page order: the bottleneck comparison of all runs first (the page that compares frameworks),
then for each run its timeline, its per-step breakdown, where it has collectives its
collective waits, then its overlap, root-cause and critical-path pages where it has the data
(:mod:`reports.causes`), and where it has power one power-over-time page per device. A sweep
directory (``instrument sweep``) gets the pages of :mod:`reports.scaling` instead.
Each run's database is built or reused exactly as ``analyze phases`` does. The PDF is
written to a temporary file and renamed, so a failed report never leaves half a PDF where a
previous one was.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.backends.backend_pdf import PdfPages

from analyze import views
from analyze.errors import AnalyzeError
from analyze.experiments import compare
from analyze.schema import STEPS
from analyze.tables import database
from analyze.tables.steps import rank_groups, step_bins
from analyze.views import Timeline
from reports import causes, energy, figures
from reports.page import Page

PNG_DPI = 200


@dataclass
class Report:
    pdf: Path
    pages: list[str]  # slugs, in page order
    pngs: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. "timeline of run-0001 aggregated"


def _safe(name: str) -> str:
    """A file-name fragment from a run name (which may hold quotes, spaces, any script)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def run_pages(con: duckdb.DuckDBPyConnection, index: int, steps: tuple[int, int] | None,
              run: str) -> tuple[views.RunLabel, list[Page], Timeline | None]:
    """The per-run pages of one run's database (``index`` keeps slugs of equal names apart)."""
    label = views.run_label(con)
    tag = f"{index:02d}-{_safe(label.name)}"
    try:
        tl = views.timeline(con, steps)
    except ValueError:
        first, last = con.execute("SELECT min(step), max(step) FROM steps").fetchone() or (None, None)
        raise AnalyzeError(
            f"{run} has no steps {steps[0] if steps else ''}:{steps[1] if steps else ''} "
            f"(it has steps {first}-{last}); choose others with --steps A:B"
        ) from None
    bins = step_bins(con)  # a long run's steps binned in SQL for the per-step bars
    groups = rank_groups(con)  # and many ranks grouped for the per-rank panels and boxes
    pages = [Page(f"{tag}-timeline", figures.timeline(tl, label)),
             Page(f"{tag}-steps", figures.step_breakdown(views.step_phases(con, bins, groups), label, bins.per,
                                                         groups))]
    device = views.device_step_phases(con, bins, groups)
    if len(device) and device["ms"].sum() > 0:  # GPU traces: what the devices did, beside the hosts
        pages.append(Page(f"{tag}-device-steps", figures.step_breakdown(device, label, bins.per, groups, device=True)))
    boxes_of = rank_groups(con, figures.MAX_BOXES)  # a box per rank or group of ranks, side by side
    waits, boxes, stragglers = views.waits_summary(con, figures.MAX_POINTS, boxes_of)
    if len(waits):
        pages.append(Page(f"{tag}-waits", figures.collective_waits(waits, stragglers, label, boxes, boxes_of)))
    pages += causes.run_pages(con, tag, label, bins, groups)
    pages += energy.run_pages(con, tag, label)  # power over time, where the trace has power
    return label, pages, tl



def build_report(
    runs: list[Path | str],
    out: Path | str,
    *,
    steps: tuple[int, int] | None = None,
    png: bool = False,
    force: bool = False,
    step_region: str | None = None,
    patterns: Path | str | None = None,
    baseline: dict[str, str] | None = None,
) -> Report:
    """Build (or reuse) each run's database and write the report to ``out`` (a .pdf).

    ``steps`` is the timeline window (half-open step range) for every run; default: a few
    steady-state steps after warm-up. With ``png``, each page is also written as
    ``<out stem>-<page>.png`` beside the PDF. ``baseline``: what a sweep's EDP is normalized to.
    """
    out = Path(out)
    if out.suffix.lower() != ".pdf":
        raise AnalyzeError(f"the report file must end in .pdf: {out}")
    if any(compare.is_sweep(Path(r)) for r in runs):
        return _sweep_report(runs, out, png, force, baseline)
    comparison = []
    pages: list[Page] = []
    notes: list[str] = []
    for i, run in enumerate(runs, start=1):
        paths = database.build(run, force=force, step_region=step_region, patterns=patterns, causes=True)
        with duckdb.connect(str(paths.db), read_only=True, config=database.read_config()) as con, \
                database.held(con, STEPS.name):
            label, mine, tl = run_pages(con, i, steps, str(run))
            per_phase = views.breakdown(con).assign(side="hosts")
            device = views.breakdown(con, device=True).assign(side="accelerators")
        comparison.append(per_phase.assign(run=label.short()))
        if len(device):  # GPU traces: their accelerators' bar beside the hosts'
            comparison.append(device.assign(run=label.short()))
        pages += mine
        if tl is not None and tl.note:
            notes.append(f"{label.name}: {tl.note}")
    pages.insert(0, Page("bottleneck", figures.bottleneck(pd.concat(comparison, ignore_index=True))))
    pngs = write(pages, out, png)
    return Report(out, [p.slug for p in pages], pngs, notes)


def _sweep_report(runs: list[Path | str], out: Path, png: bool, force: bool,
                  baseline: dict[str, str] | None = None) -> Report:
    """A sweep's pages (reports/scaling.py); per-run pages are left to ``analyze report RUN``."""
    if len(runs) > 1:
        sweep = next(r for r in runs if compare.is_sweep(Path(r)))
        raise AnalyzeError(f"{sweep} is a sweep directory: report it alone (analyze report SWEEP "
                           "-o FILE.pdf), or name single runs only.")
    from reports.scaling import sweep_pages

    result = compare.compare(Path(runs[0]), force=force, baseline=baseline)
    pages = sweep_pages(result)
    pngs = write(pages, out, png)
    notes = [*result.notes, f"no per-run pages for a sweep; draw a run's with analyze report "
                            f"{runs[0]}/RUN"]
    return Report(out, [p.slug for p in pages], pngs, notes)


def write(pages: list[Page], out: Path, png: bool = False) -> list[Path]:
    """Draw ``pages`` into the PDF ``out`` (and PNGs beside it); return the PNG paths."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AnalyzeError(f"cannot create the report directory {out.parent}: {e.strerror}") from None
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    pngs = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # plotnine's notes on saving; the figures are checked by tests
            # no creation date: the same run gives the same bytes (a paper's figures under version control)
            with PdfPages(tmp, metadata={"CreationDate": None}) as pdf:
                for page in pages:
                    fig = page.plot.draw()
                    pdf.savefig(fig, dpi=PNG_DPI)  # the resolution of any part drawn as an image
                    if png:
                        path = out.with_name(f"{out.stem}-{page.slug}.png")
                        fig.savefig(path, dpi=PNG_DPI)
                        pngs.append(path)
                    plt.close(fig)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise AnalyzeError(f"cannot write the report {out}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return pngs
