"""``analyze export RUN --format chrome [-o FILE.json.gz | -o DIR]``: the run as Chrome trace JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyze.cli.common import display

FORMATS = ("chrome",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export", help="write a trace as Chrome trace JSON (Perfetto, chrome://tracing, Holistic Trace Analysis)",
        description="Read RUN (ours, Score-P's or per-rank Kineto files) and write it as Chrome trace "
        "JSON: to a .json or .json.gz file, one process per rank, for Perfetto's UI and "
        "chrome://tracing; or, given a directory, one Kineto-style file per rank, for Holistic "
        "Trace Analysis (an imported Kineto trace comes back as it was). See docs/gpu.md.")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory, Score-P experiment, .otf2 file "
                   "or directory of Kineto files")
    p.add_argument("--format", choices=FORMATS, default="chrome", help="output format (chrome)")
    p.add_argument("-o", "--output", type=Path, metavar="PATH",
                   help="FILE.json[.gz] for one file, or a directory for one file per rank "
                   "(default: <run name>.chrome.json.gz in the current directory)")
    p.add_argument("--steps", metavar="A:B",
                   help="only steps A to B-1 and what overlaps them (a long run is more than Perfetto's UI loads)")
    p.add_argument("--db", type=Path, help="database file (default RUN/trace.duckdb)")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.export import chrome
    from analyze.tables import database
    from analyze.tables.steps import parse_steps

    steps = parse_steps(ns.steps) if ns.steps else None
    out = ns.output or Path(f"{database.resolve(ns.run, ns.db).name}.chrome.json.gz")
    paths, written = database.built(ns.run, lambda con: chrome.export(con, out, steps), db=ns.db)
    n = len(written)
    what = display(written[0]) if chrome.is_merged(out) else f"{n} file{'s' if n != 1 else ''} in {display(out)}"
    print(f"written: {what}")
    return 0
