"""``analyze causes RUN``: who made whom wait, and in which region of its step."""

from __future__ import annotations

import argparse
from typing import Any

from analyze.cli.common import display
from analyze.cli.overlap import add_run_arguments


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "causes", help="root causes of idle time: the late rank and the regions that made it late",
        description="Attribute every idle interval to the rank that arrived last and to the regions "
        "of its step in which it spent longer than the waiting rank (Scalasca's delay analysis; "
        "docs/causes.md). On accelerators (Kineto traces), also which rank's collective kernels "
        "started last and what its device did before. Prints the largest causes; the delays and "
        "delay_totals tables are in RUN/trace.duckdb.")
    add_run_arguments(p)
    p.add_argument("--top", type=int, default=10, metavar="N", help="causes to print (default 10)")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.tables import database
    from analyze.tables.causes import views

    def read(con: Any) -> tuple[list[str], Any, Any, list[str]]:
        idle, steps = con.execute("""SELECT sum(duration_ns) FILTER (WHERE phase = 'idle'),
                                            count(DISTINCT (rank, step)) FROM phases""").fetchall()[0]
        return views.delay_lines(con, ns.top), idle, steps, views.device_wait_lines(con, ns.top)

    paths, (lines, idle, steps, device) = database.built(ns.run, read, force=ns.force, step_region=ns.step_region,
                                                         causes=True)
    if not lines:
        print("no idle time on the hosts: no rank waited for another" if device
              else "no idle time: no rank waited for another")
    else:
        print(f"idle time: {(idle or 0) / 1e6:.1f} ms over {steps} rank-steps; its causes, largest first:")
        for line in lines:
            print(f"  {line}")
    if device:
        print("on the accelerators, collective kernels waited for the last rank's; who was last, largest first:")
        for line in device:
            print(f"  {line}")
    print(f"database: {display(paths.db)}")
    return 0
