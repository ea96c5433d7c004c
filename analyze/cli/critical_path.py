"""``analyze critical-path RUN``: per step, the chain of work that set its length."""

from __future__ import annotations

import argparse

from analyze.cli.common import display
from analyze.cli.overlap import add_run_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "critical-path", help="per step: the critical path across ranks and the cost of imbalance",
        description="Walk each step back from its end through the waits to the ranks that ended "
        "them: the path's length, who is on it, and the step time perfect balance would give "
        "(docs/causes.md). The critical_path, critical_path_regions and step_balance tables are "
        "in RUN/trace.duckdb.")
    add_run_arguments(p)
    p.add_argument("--top", type=int, default=8, metavar="N",
                   help="rank/region contributions to print (default 8)")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.tables import database
    from analyze.tables.causes import views

    paths, (steps, parts) = database.built(
        ns.run, lambda con: (views.critical_path_summary(con), views.path_contributions(con)),
        force=ns.force, step_region=ns.step_region, causes=True)
    print(steps.to_string(index=False, na_rep="-"))
    if len(steps):
        cost = steps["imbalance_ms"].sum()
        total = steps["path_ms"].sum()
        print(f"imbalance cost: {cost:.1f} ms of {total:.1f} ms ({100 * cost / total if total else 0:.1f}%)")
    print("\nwhere the critical path's time goes (all steps):")
    print(parts.head(ns.top).to_string(index=False, na_rep="-"))
    print(f"database: {display(paths.db)}")
    return 0
