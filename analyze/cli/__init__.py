"""``analyze``: read traces into DuckDB and report where the time goes.

Thin verbs over library functions, one module per verb in this package: each defines
``add_parser(subparsers)`` (which sets ``command``) and ``run(namespace) -> int`` and imports the library (DuckDB,
pandas, plotnine) only inside ``run``, so ``analyze --help`` and a mistyped argument answer at
once. Errors a user can fix print one sentence and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from analyze import heap
from analyze.errors import AnalyzeError
from analyze.tables.runpath import DB_NAME, otf2_anchors

# Verbs in the order ``analyze --help`` lists them; each is the module analyze.cli.<verb>.
VERBS = ("phases", "patterns", "overlap", "causes", "critical-path", "balance", "energy", "report",
         "compare", "diff", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="analyze", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        importlib.import_module(f"analyze.cli.{verb.replace('-', '_')}").add_parser(sub)
    return parser


# Heap faulted in before a build, per core at most (its read tasks, one per core, each hold a
# chunk of rows); a build's working set is about twice its archive's event files.
WARM_PER_CORE = 128 << 20
WARM_PER_EVENT_BYTE = 2
# and at most this much: below the heap's trim threshold (analyze/heap.py), beyond which freeing
# the warmed blocks would hand them back at once
WARM_MOST = 384 << 20


def heap_to_warm(ns: argparse.Namespace) -> int:
    """How much heap :func:`heap.warm` should fault in for the command ``ns``: for the OTF2
    archives it will read into tables in this process, about a build's working set (of the
    largest: builds run one after the other, and reuse the heap); none for the Dask engine
    (its workers build) or a run whose database is newer than its archive (current, most
    likely: analyze.tables.database decides), unless ``--force``."""
    if getattr(ns, "engine", "local") != "local":
        return 0
    runs = getattr(ns, "runs", None) or [getattr(ns, "run", None)]
    largest = 0
    for run in runs:
        if run is None:  # a verb without runs
            continue
        try:
            largest = max(largest, _events_to_build(Path(run), getattr(ns, "db", None),
                                                    bool(getattr(ns, "force", False))))
        except OSError:  # the verb says what is wrong with the path
            continue
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(WARM_PER_EVENT_BYTE * largest, WARM_PER_CORE * cores, WARM_MOST)


def _events_to_build(run: Path, db: Path | None, force: bool) -> int:
    """Bytes of event files of ``run``'s OTF2 archive, if its tables are to be built (0 for
    Chrome trace JSON, which the Python reader reads)."""
    anchor = run
    if run.is_dir():
        found = otf2_anchors(run)
        if len(found) != 1:
            return 0
        anchor = found[0]
    elif run.suffix != ".otf2":
        return 0
    database = db or anchor.parent / DB_NAME
    if not force and database.is_file() and database.stat().st_mtime_ns >= anchor.stat().st_mtime_ns:
        return 0
    return sum(f.stat().st_size for f in anchor.with_suffix("").glob("*.evt"))


def main(argv: list[str] | None = None) -> int:
    # before any thread or large array exists: this process keeps the memory it frees
    heap.keep_freed_memory()
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    heap.warm(heap_to_warm(ns))  # while the verb imports its libraries
    try:
        return int(ns.command(ns))
    except AnalyzeError as e:
        print(f"analyze: {e}", file=sys.stderr)
        return e.exit_status
    except BrokenPipeError:  # `analyze phases RUN | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except OSError as e:  # a path the user gave that cannot be read or written
        if e.filename is None:
            raise
        print(f"analyze: {e.filename}: {e.strerror}; check the path and its permissions", file=sys.stderr)
        return 1
