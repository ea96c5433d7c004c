"""How long the report's timeline takes for a window holding N phase intervals.

    .venv/bin/python bench/report_timeline.py [--intervals 1000000]

Builds a synthetic database in memory (one rank, alternating forward and all-reduce regions,
1,000 per 1 ms step; no archive involved), then times ``analyze.views.timeline`` over all
steps (which aggregates above 20,000 intervals) and drawing the figure to a PDF page.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyze import views  # noqa: E402
from reports import figures  # noqa: E402
from reports.report import Page, write  # noqa: E402
from tests.reports.test_figures import synthetic_db  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intervals", type=int, default=1_000_000)
    args = p.parse_args()
    per_step = 1000
    steps = max(1, args.intervals // per_step)
    con = synthetic_db(steps, per_step)
    t0 = time.perf_counter()
    tl = views.timeline(con, (0, steps))
    t1 = time.perf_counter()
    plot = figures.timeline(tl, views.run_label(con))
    with tempfile.TemporaryDirectory() as d:
        write([Page("timeline", plot)], Path(d) / "t.pdf")
    t2 = time.perf_counter()
    print(f"intervals in window: {steps * per_step:,} regions -> {tl.intervals:,} phase intervals; "
          f"bars drawn: {len(tl.bars):,}; note: {tl.note}")
    print(f"timeline table: {t1 - t0:.2f} s; figure to PDF: {t2 - t1:.2f} s; total {t2 - t0:.2f} s")


if __name__ == "__main__":
    main()
