"""``analyze diff A B``: what changed per step between two runs or two sets of runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyze.cli.common import display


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff", help="per phase, region, collective and kernel: the change in time per step, with CIs",
        description="Compare B against A: per phase, per region (exclusive time on the main "
        "threads), per collective and, on runs with accelerator streams, per device phase and "
        "kernel, the change in mean time per step with a 95% confidence "
        "interval over steps (one run a side) or over runs (several a side), largest first. A and "
        "B are run directories, directories of runs (replications, a sweep) or SWEEP@N, "
        "configuration N of a sweep.")
    p.add_argument("a", metavar="A", help="the baseline: run, directory of runs, or SWEEP@N")
    p.add_argument("b", metavar="B", help="what is compared with it")
    p.add_argument("--top", type=int, default=15, metavar="N", help="rows to print (default 15)")
    p.add_argument("-o", "--output", type=Path, help="also write the diff page as a PDF (and PNG)")
    p.add_argument("--force", action="store_true", help="rebuild the runs' databases")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.errors import AnalyzeError
    from analyze.experiments import diff

    if ns.output is not None and ns.output.suffix.lower() != ".pdf":
        raise AnalyzeError(f"the diff page must be written to a .pdf file: {ns.output}")
    table, a, b = diff.diff(ns.a, ns.b, force=ns.force)
    print(diff.text(table, a, b, ns.top))
    if ns.output is not None:
        from reports.causes import diff_page
        from reports.report import write

        pngs = write([diff_page(table, a.label, b.label)], ns.output, png=True)
        print(f"diff page written: {display(ns.output)}  ({', '.join(display(p) for p in pngs)})")
    return 0
