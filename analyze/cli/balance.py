"""``analyze balance RUN``: per-rank throughput and the batch shares that would balance the step."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from analyze.cli.common import add_all_ranks, display, grouping_note, rank_groups_of, ranks_per_row
from analyze.cli.overlap import add_run_arguments

SHARES_FILE = "balanced_shares.txt"  # beside the run's database, when there are too many to print


def shares(text: str) -> list[float]:
    """``0.7,0.3`` -> [0.7, 0.3]; ``@FILE``: the shares in FILE (separated by commas or white
    space), as ``analyze balance`` writes them for many ranks."""
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as e:
            raise argparse.ArgumentTypeError(f"cannot read shares from {text[1:]}: {e.strerror}") from None
    try:
        values = [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shares such as 0.7,0.3, not {text[:60]!r}") from None
    if not values or min(values) < 0 or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected non-negative shares such as 0.7,0.3, not {text[:60]!r}")
    return values


def decimals(values: Any) -> int:
    """Decimals that show the smallest positive share with three significant digits (at least
    three): 0.374 for two ranks, 0.000244 for 4,096, not 0.000."""
    positive = [v for v in values if v == v and v > 0]
    return max(3, 2 - math.floor(math.log10(min(positive)))) if positive else 3


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "balance", help="per-rank throughput and the shares of the batch that would balance ranks",
        description="Per rank: compute per step, its part that grows with the samples (data "
        "loading, forward, backward), throughput, and the shares of the global batch that would "
        "give every rank the same compute time, with the predicted step time (docs/causes.md). "
        "Shares and batch come from the run's --shares and --global-batch parameters (or "
        "--batch-size, equal shares) unless given here. Above 64 ranks the table shows groups of "
        f"consecutive ranks and the shares that balance go to {SHARES_FILE} beside the run's "
        "database (--shares @FILE reads them back).")
    add_run_arguments(p)
    add_all_ranks(p)
    p.add_argument("--shares", type=shares, metavar="A,B,...",
                   help="the shares the run used, one per rank, or @FILE (default: from run.json)")
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
    per = ranks_per_row(len(table), int(table["rank"].max()) + 1, ns.all_ranks)
    digits = decimals(list(table["share"]) + list(table["balanced_share"]))
    shown = table[cols].astype("Float64").astype(float).astype({"rank": int})  # NULL as NaN, printed "-"
    if per > 1:
        print(grouping_note(len(table), per))
        shown = rank_groups_of(shown, per)
    # shares with the digits that tell them apart, samples whole (a group's mean to a tenth)
    formats = {"share": f".{digits}f", "balanced_share": f".{digits}f",
               "samples": ".0f" if per == 1 else ".1f", "balanced_samples": ".0f" if per == 1 else ".1f"}
    text = shown.astype(object)
    for c in shown.columns[1:]:
        f = formats.get(c, ".3f")
        text[c] = ["-" if v != v else format(v, f) for v in shown[c]]
    # every column a space wider than its header and its widest value: two spaces apart, as numbers print
    width = {c: 1 + max(len(c), *(len(str(v)) for v in text[c])) for c in text.columns}
    print(text.to_string(index=False, col_space=width))
    suggested = ",".join(f"{v:.{digits}f}" for v in table["balanced_share"])
    whole = table["balanced_samples"].notna().all()
    if per == 1:
        print(f"shares that balance compute: --shares {suggested}"
              + (f" ({' + '.join(str(int(v)) for v in table['balanced_samples'])} samples)" if whole else ""))
    else:
        out = paths.db.parent / SHARES_FILE
        out.write_text(suggested + "\n")
        print(f"shares that balance compute, {len(table):,} of them"
              + (f" ({int(table['balanced_samples'].sum()):,} samples)" if whole else "")
              + f": written to {display(out)}; give them as --shares @{display(out)} here, or to a "
              f"script as --shares \"$(cat {display(out)})\"")
    now = table["step_ms"].max()
    predicted = table["predicted_step_ms"].iloc[0]
    print(f"predicted step: {predicted:.1f} ms (compute {table['predicted_compute_ms'].iloc[0]:.1f} ms on "
          f"every rank), now {now:.1f} ms")
    print(f"database: {display(paths.db)}")
    return 0
