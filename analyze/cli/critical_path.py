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
        "in RUN/trace.duckdb. For traces with accelerator streams, also the path through the waits "
        "inside collective kernels (NCCL/RCCL), which the hosts' path cannot see.")
    add_run_arguments(p)
    p.add_argument("--top", type=int, default=8, metavar="N",
                   help="rank/region contributions to print (default 8)")
    p.add_argument("--steps", type=int, default=40, metavar="N",
                   help="steps to print: all if the run has at most N, else the N of the largest "
                   "imbalance cost, in step order (default 40; 0: all); the step_balance table has every step")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.tables import database
    from analyze.tables.causes import views

    limit = ns.steps if ns.steps > 0 else None
    paths, (steps, (count, cost, total), parts, (device, device_ranks)) = database.built(
        ns.run, lambda con: (views.critical_path_summary(con, limit), views.imbalance_total(con),
                             views.path_contributions(con), views.device_path_summary(con, limit)),
        force=ns.force, step_region=ns.step_region, causes=True)
    print(steps.to_string(index=False, na_rep="-"))
    if len(steps) < count:
        print(f"({len(steps)} of {count} steps: those of the largest imbalance cost; --steps 0 prints all)")
    if count:
        print(f"imbalance cost: {cost:.1f} ms of {total:.1f} ms ({100 * cost / total if total else 0:.1f}%)")
    print("\nwhere the critical path's time goes (all steps):")
    print(parts.head(ns.top).to_string(index=False, na_rep="-"))
    if len(device):
        # the path above is the hosts': on a GPU trace they launch and go on, the waiting is in the kernels
        print("\non the accelerators (walked back through the waits inside collective kernels):")
        print(device.to_string(index=False, na_rep="-"))
        if len(device) < count:
            print(f"({len(device)} of {count} steps: those whose path spends longest on other ranks than the "
                  "one that ended it; --steps 0 prints all)")
        print("where the accelerators' path runs (all steps):")
        print(device_ranks.head(ns.top).to_string(index=False, na_rep="-"))
    print(f"database: {display(paths.db)}")
    return 0
