"""``analyze compare SWEEP``: one table across a sweep's runs, with models."""

from __future__ import annotations

import argparse
from pathlib import Path

from analyze.cli.common import display, int_list


def levels(text: str) -> dict[str, str]:
    """``ranks=1,model=big`` -> {"ranks": "1", "model": "big"}."""
    out = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected FACTOR=LEVEL such as ranks=1, not {text!r}")
        out[key.strip()] = value.strip()
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="one table across a sweep's runs: means, CIs, speedup, models",
        description="Build (or reuse) the database of every run under SWEEP (the directory "
        "instrument sweep wrote) and write SWEEP/compare.duckdb: per-run and per-configuration "
        "means with 95% confidence intervals, speedup and efficiency, allocation of variation, "
        "fits against ranks and an allreduce model with hold-out predictions; where the runs have "
        "power, energy, energy per sample and EDP normalized to a baseline (docs/energy.md).")
    p.add_argument("sweep", type=Path, metavar="SWEEP", help="sweep directory (or any directory of runs)")
    p.add_argument("--predict-ranks", metavar="P,Q", type=int_list, default=[],
                   help="also predict allreduce time per step at these rank counts")
    p.add_argument("--baseline", metavar="FACTOR=LEVEL", type=levels, default=None,
                   help="the configuration EDP is normalized to, e.g. ranks=1 or device=gpu1 (several: "
                   "a=1,b=2); default: the one with the fewest ranks")
    p.add_argument("--force", action="store_true", help="rebuild the runs' databases")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.experiments import compare

    result = compare.compare(ns.sweep, force=ns.force, predict_ranks=ns.predict_ranks, baseline=ns.baseline)
    print(compare.text(result))
    print(f"database: {display(result.db)}")
    return 0
