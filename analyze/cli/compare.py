"""``analyze compare SWEEP``: one table across a sweep's runs, with models."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyze.cli.common import display, int_list


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="one table across a sweep's runs: means, CIs, speedup, models",
        description="Build (or reuse) the database of every run under SWEEP (the directory "
        "instrument sweep wrote) and write SWEEP/compare.duckdb: per-run and per-configuration "
        "means with 95%% confidence intervals, speedup and efficiency, allocation of variation, "
        "fits against ranks and an allreduce model with hold-out predictions.")
    p.add_argument("sweep", type=Path, metavar="SWEEP", help="sweep directory (or any directory of runs)")
    p.add_argument("--predict-ranks", metavar="P,Q", type=int_list, default=[],
                   help="also predict allreduce time per step at these rank counts")
    p.add_argument("--force", action="store_true", help="rebuild the runs' databases")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.experiments import compare

    result = compare.compare(ns.sweep, force=ns.force, predict_ranks=ns.predict_ranks)
    print(compare.text(result))
    print(f"database: {display(result.db)}")
    return 0
