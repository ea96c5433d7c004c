"""``analyze report RUN...``: the figures of runs (or a sweep) as one PDF."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyze.cli.common import display
from analyze.cli.compare import levels


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="figures of one or more runs as a multi-page PDF",
        description="Build (or reuse) each RUN's database and write a PDF: the bottleneck "
        "comparison of all runs, then per run its timeline, per-step breakdown, collective "
        "waits and power over time per device. A sweep directory (instrument sweep) gets its scaling, phase, model and "
        "prediction pages instead (docs/experiments.md).")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories or archives")
    p.add_argument("-o", "--output", type=Path, default=Path("reports/report.pdf"),
                   help="the PDF to write (default reports/report.pdf)")
    p.add_argument("--steps", metavar="A:B",
                   help="timeline window: steps A to B-1 (default: a few steps after warm-up)")
    p.add_argument("--png", action="store_true", help="also write one PNG per page beside the PDF")
    p.add_argument("--force", action="store_true", help="rebuild the databases")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when a trace has no step markers")
    p.add_argument("--patterns", type=Path, metavar="FILE.toml",
                   help="name patterns tried before the defaults (as given to analyze phases)")
    p.add_argument("--baseline", metavar="FACTOR=LEVEL", type=levels, default=None,
                   help="a sweep's EDP baseline, as for analyze compare")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    # The only verb that reaches into ``reports``: plotnine loads only for reports.
    from analyze.tables.steps import parse_steps
    from reports.report import build_report

    steps = parse_steps(ns.steps) if ns.steps else None
    report = build_report(ns.runs, ns.output, steps=steps, png=ns.png, force=ns.force,
                          step_region=ns.step_region, patterns=ns.patterns, baseline=ns.baseline)
    for note in report.notes:
        print(f"note: {note}")
    print(f"report written: {display(report.pdf)}  ({len(report.pages)} pages)")
    for png in report.pngs:
        print(f"  {display(png)}")
    return 0
