"""``instrument sweep DESIGN``: run a designed experiment, replicated, randomized, resumable."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a designed experiment: every configuration, replicated, randomized",
        description="Run every configuration of DESIGN (a TOML file of factors and levels; see "
        "docs/experiments.md) REPLICATIONS times in an order randomized from its seed, one run "
        "directory per replication under OUT/<name>/. Running it again resumes: complete runs "
        "are skipped.")
    p.add_argument("design", type=Path, metavar="DESIGN", help="the design file (runs/designs/*.toml)")
    p.add_argument("--out", type=Path, default=Path("traces/sweeps"),
                   help="where sweep directories go (default traces/sweeps/)")
    p.add_argument("--name", help="sweep directory name (default: the design's name)")
    p.add_argument("--retry-failed", action="store_true", help="also rerun runs that failed before")
    p.add_argument("--show-output", action="store_true",
                   help="print the ranks' output (default: into each run's output.log)")
    p.add_argument("--dry-run", action="store_true", help="print the run order and stop")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument.experiments import design, sweep

    plan_of = design.load(ns.design)
    if ns.dry_run:
        for spec in plan_of.plan():
            print(f"{spec.order:>4}  {spec.name}  (-np {spec.nprocs} {spec.script} {' '.join(spec.args)})")
        return 0
    result = sweep.run(plan_of, ns.out, name=ns.name, retry_failed=ns.retry_failed,
                       show_output=ns.show_output, command=["instrument", *argv])
    done = len(result.ran) + len(result.skipped) - len(result.failed)
    print(f"sweep {result.sweep_dir}: {done} of {result.planned} runs complete, "
          f"{len(result.failed)} failed" + (": " + ", ".join(result.failed[:5]) + (
              ", ..." if len(result.failed) > 5 else "") if result.failed else ""))
    if result.interrupted:
        print("interrupted: run the same command again to resume", file=sys.stderr)
    elif result.failed:
        print("failed runs are kept with their output.log; --retry-failed reruns them", file=sys.stderr)
    print(f"next: analyze compare {result.sweep_dir}")
    return result.exit_status
