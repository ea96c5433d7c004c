"""``instrument merge RUN``: (re)build a run's archive from whatever per-rank files exist."""

from __future__ import annotations

import argparse
from pathlib import Path

from instrument.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="(re)build a run's OTF2 archive from its per-rank files",
                       description="Build RUN/traces.otf2 from whatever per-rank files exist "
                       "(after a killed job, or ranks started by your own launcher).")
    p.add_argument("run_dir", type=Path, metavar="RUN")
    p.add_argument("--merged", action="store_true",
                   help="merge every rank's records in this process instead of assembling the archive "
                        "from the ranks' own OTF2 event files (and converting the spill files of ranks "
                        "that did not write theirs)")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument.launch import runinfo
    from instrument.launch.job import build_archive, counted
    from instrument.tracer import merge

    if not ns.run_dir.is_dir():
        raise UsageError(f"run directory not found: {ns.run_dir}")
    info = runinfo.read(ns.run_dir)
    try:
        result, archive = build_archive(ns.run_dir, info.get("ranks"), str(info.get("tracer") or "builtin"),
                                        merged=ns.merged)
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    print(f"trace written: {archive}  ({counted(len(result.ranks), 'rank')}, {result.events:,} events)"
          + ("" if result.complete else "  [incomplete]"))
    return 0
