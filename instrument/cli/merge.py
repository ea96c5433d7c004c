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
    p.set_defaults(command=run)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument.launch import runinfo
    from instrument.scorep import merge as scorep_merge
    from instrument.tracer import merge
    from traceio.otf2_writer import write_archive

    if not ns.run_dir.is_dir():
        raise UsageError(f"run directory not found: {ns.run_dir}")
    info = runinfo.read(ns.run_dir)
    collect = scorep_merge.collect if info.get("tracer") == "scorep" else merge.collect
    try:
        result = collect(ns.run_dir, expected_ranks=info.get("ranks"))
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    archive = write_archive(result.spec, ns.run_dir)
    print(f"trace written: {archive}  ({len(result.ranks)} ranks, {result.events:,} events)"
          + ("" if result.complete else "  [incomplete]"))
    return 0
