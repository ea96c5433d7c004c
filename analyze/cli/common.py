"""What several verbs share: argument types, how paths are shown, and how many ranks print."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

MAX_PRINTED_RANKS = 64  # ranks printed a row each; more: groups of consecutive ranks
GROUPS = 32  # rows printed for a run of more ranks


def add_all_ranks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all-ranks", action="store_true",
                   help=f"print every rank (default: above {MAX_PRINTED_RANKS} ranks, {GROUPS} groups of "
                   "consecutive ranks, each row their mean)")


def rank_grouping(con: Any, all_ranks: bool) -> tuple[int, int]:
    """(ranks, per): the run's ranks (with steps) and how many consecutive rank numbers
    (``rank // per``) one printed row holds: 1 with ``all_ranks`` or at most
    :data:`MAX_PRINTED_RANKS` ranks."""
    (ranks, top), = con.execute("SELECT count(DISTINCT rank), coalesce(max(rank) + 1, 0) FROM steps").fetchall()
    return ranks, ranks_per_row(ranks, top, all_ranks)


def ranks_per_row(ranks: int, top: int, all_ranks: bool) -> int:
    """Consecutive rank numbers one printed row holds, for ``ranks`` ranks numbered below
    ``top``: 1 with ``all_ranks`` or at most :data:`MAX_PRINTED_RANKS` ranks."""
    from analyze.tables.steps import per_bin

    return 1 if all_ranks or ranks <= MAX_PRINTED_RANKS else per_bin(top, GROUPS)


def grouping_note(ranks: int, per: int) -> str | None:
    """The line printed above a table of grouped ranks (None: one rank a row)."""
    if per == 1:
        return None
    return f"{ranks:,} ranks in groups of {per} consecutive ranks, each row their mean (--all-ranks prints every rank)"


def rank_groups_of(rows: Any, per: int) -> Any:
    """Per-rank rows (a ``rank`` column, numbers in the others) as groups of ``per``
    consecutive ranks, indexed by group (rank // per): ``ranks`` (first-last) and each other
    column's mean over the group's ranks (``steps`` becomes ``steps/rank``)."""
    g = rows["rank"] // per
    label = rows["rank"].groupby(g).agg(lambda r: f"{r.min()}" if r.min() == r.max() else f"{r.min()}-{r.max()}")
    out = rows.drop(columns="rank").groupby(g).mean()
    out.insert(0, "ranks", label)
    return out.rename(columns={"steps": "steps/rank"})


def display(path: Path) -> str:
    """``path`` relative to the working directory when it is under it; links are kept (a
    run's ``tables`` link, not the build folder it points to, which the next build replaces)."""
    for candidate in (Path(os.path.abspath(path)), path.resolve()):
        try:
            return str(candidate.relative_to(Path.cwd()))
        except ValueError:
            pass
    return str(path)


def int_list(text: str) -> list[int]:
    """``4,8`` -> [4, 8]: positive rank counts."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts such as 4,8, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive rank counts such as 4,8, not {text!r}")
    return values
