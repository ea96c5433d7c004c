"""``analyze patterns [RUN]``: each region of a trace with the category it got and why, or
(without RUN) the name patterns themselves."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analyze.cli.common import display

WIDTH = 72  # region names (C++ signatures) are cut to this many characters


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "patterns", help="each region's category and why (which pattern or OTF2 record); the patterns",
        description="Build (or reuse) RUN's database and list the regions entered in the trace: the "
        "category each got (collective, p2p, wait, runtime, compute...) and why: our marker name, "
        "its OTF2 paradigm or role, its collective records, the name pattern that matched, or "
        "'default: compute'. Compute regions whose names contain a communication word are marked "
        "'?': check them before trusting the numbers. Without RUN, list the patterns (a --patterns "
        "file's first, then the defaults, with the source of each name).")
    p.add_argument("run", type=Path, nargs="?", metavar="RUN",
                   help="run directory, Score-P experiment or .otf2 file")
    p.add_argument("--patterns", type=Path, metavar="FILE.toml",
                   help="name patterns tried before the defaults (format: docs/frameworks.md)")
    p.add_argument("--all", action="store_true", help="also list regions defined but never entered")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps (as given to analyze phases, to reuse its database)")
    p.add_argument("--db", type=Path, help="database file (default RUN/trace.duckdb)")
    p.add_argument("--force", action="store_true", help="rebuild the database even if it is current")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace) -> int:
    if ns.run is None:
        from analyze.tables import pattern_set

        print(pattern_set.text(pattern_set.load(ns.patterns)))
        return 0
    from analyze.tables import database, regions

    def read(con: Any) -> tuple[Any, list[Any]]:
        return regions.region_table(con, everything=ns.all), con.execute(
            """SELECT cm.name, count(*), count(DISTINCT c.rank), min(c.ranks_matched)
               FROM collectives c JOIN communicators cm USING (comm_id)
               WHERE c.source = 'name' GROUP BY cm.name ORDER BY cm.name""").fetchall()

    paths, (table, named) = database.built(ns.run, read, db=ns.db, force=ns.force, step_region=ns.step_region,
                                           patterns=ns.patterns)
    # matched: rows in `collectives` (from records or by name); a name-matched region nested in
    # another communication region has none: it is part of that one
    rows = [("", "region", "category", "op", "instances", "matched", "main_ms", "why")]
    rows += [("?" if r.suspect else "", r.region if len(r.region) <= WIDTH else r.region[: WIDTH - 3] + "...",
              r.category, r.op if isinstance(r.op, str) else "", str(r.instances), str(r.records + r.by_name),
              f"{r.main_ms:.3f}", r.why) for r in table.itertuples()]
    widths = [max(len(row[i]) for row in rows) for i in range(7)]
    for row in rows:
        cells = [c.rjust(w) if i in (4, 5, 6) else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))]
        print("  ".join([*cells, row[7]]).rstrip())
    for group, rows, ranks, matched in named:
        print(f"\n{group.removeprefix('name-only: ')}: {rows} collectives recognized by name on {ranks} ranks, "
              f"matched by order (fewest ranks in one instance: {matched}); bytes unknown")
    suspects = int(table["suspect"].sum())
    if suspects:
        print(f"\n?: {suspects} region{'s' if suspects != 1 else ''} counted as compute with a communication "
              "word in the name; if they communicate, add a pattern (analyze phases --patterns FILE.toml, "
              "docs/frameworks.md)")
    print(f"database: {display(paths.db)}")
    return 0
