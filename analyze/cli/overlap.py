"""``analyze overlap RUN``: how much communication the main thread's compute hid."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analyze.cli.common import add_all_ranks, display, grouping_note, rank_grouping


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """RUN and the build options every per-run verb shares with ``analyze phases``."""
    p.add_argument("run", type=Path, metavar="RUN", help="run directory, Score-P experiment or .otf2 file")
    p.add_argument("--force", action="store_true", help="rebuild the database even if it is current")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when the trace has no step markers")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "overlap", help="communication hidden under compute and exposed, per rank and kind",
        description="Per rank and kind of communication (each collective op, p2p, all): mean time "
        "per step with communication in flight on any lane, the part hidden under compute, the "
        "exposed part, and the overlap ratio over the run (the overlap table, per step, is in "
        "RUN/trace.duckdb); for traces with accelerator streams, also the device's communication "
        "kernels hidden under compute kernels (device_phases).")
    add_run_arguments(p)
    add_all_ranks(p)
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.tables import database
    from analyze.tables.causes import views

    def read(con: Any) -> tuple[Any, ...]:
        ranks, per = rank_grouping(con, ns.all_ranks)
        return views.overlap_summary(con, per), views.device_overlap_summary(con, per), grouping_note(ranks, per)

    paths, (table, device, note) = database.built(ns.run, read, force=ns.force, step_region=ns.step_region,
                                                  causes=True)
    if note:
        print(note)
    print(table.to_string(index=False, na_rep="-"))
    print("ms per step (mean over steps); comm: wall time with communication in flight; busy: summed "
          "over lanes; overlap = hidden / comm")
    if len(device):
        # the table above is the host's: communication kernels on accelerator streams are not in it
        print("\non the accelerators (device_phases: communication kernels, hidden under compute kernels):")
        print(device.to_string(index=False, na_rep="-"))
    print(f"database: {display(paths.db)}")
    return 0
