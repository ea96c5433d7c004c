"""``analyze balance RUN``: per-rank throughput and the batch shares that would balance the step."""

from __future__ import annotations

import argparse

from analyze.cli.common import display
from analyze.cli.overlap import add_run_arguments


def shares(text: str) -> list[float]:
    """``0.7,0.3`` -> [0.7, 0.3]."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shares such as 0.7,0.3, not {text!r}") from None
    if not values or min(values) < 0 or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected non-negative shares such as 0.7,0.3, not {text!r}")
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "balance", help="per-rank throughput and the shares of the batch that would balance ranks",
        description="Per rank: compute per step, its part that grows with the samples (data "
        "loading, forward, backward), throughput, and the shares of the global batch that would "
        "give every rank the same compute time, with the predicted step time (docs/causes.md). "
        "Shares and batch come from the run's --shares and --global-batch parameters (or "
        "--batch-size, equal shares) unless given here.")
    add_run_arguments(p)
    p.add_argument("--shares", type=shares, metavar="A,B,...",
                   help="the shares the run used, one per rank (default: from run.json)")
    p.add_argument("--global-batch", type=int, metavar="N", help="samples per step, all ranks")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    from analyze.errors import AnalyzeError
    from analyze.tables import database
    from analyze.tables.causes import balance

    paths, table = database.built(ns.run, lambda con: con.execute("SELECT * FROM rank_balance ORDER BY rank").df(),
                                  force=ns.force, step_region=ns.step_region, causes=True)
    if table.empty:
        raise AnalyzeError(f"{ns.run} has no steps to balance")
    if ns.shares is not None or ns.global_batch is not None:
        given = ns.shares or list(table["share"])
        if len(given) != len(table):
            raise AnalyzeError(f"--shares gives {len(given)} shares for {len(table)} ranks; give one per rank")
        total = ns.global_batch or (float(table["samples"].sum()) if table["samples"].notna().all() else None)
        table = balance.rebalance(table, [v / sum(given) for v in given], total)
    cols = ["rank", "share", "samples", "step_ms", "compute_ms", "scaled_ms", "fixed_ms", "idle_ms",
            "throughput_sps", "balanced_share", "balanced_samples"]
    print(table[cols].round(3).to_string(index=False, na_rep="-"))
    suggested = ",".join(f"{v:.3f}" for v in table["balanced_share"])
    now = table["step_ms"].max()
    predicted = table["predicted_step_ms"].iloc[0]
    print(f"shares that balance compute: --shares {suggested}"
          + (f" ({' + '.join(str(int(v)) for v in table['balanced_samples'])} samples)"
             if table["balanced_samples"].notna().all() else ""))
    print(f"predicted step: {predicted:.1f} ms (compute {table['predicted_compute_ms'].iloc[0]:.1f} ms on "
          f"every rank), now {now:.1f} ms")
    print(f"database: {display(paths.db)}")
    return 0
