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

from analyze import heap
from analyze.errors import AnalyzeError

# Verbs in the order ``analyze --help`` lists them; each is the module analyze.cli.<verb>.
VERBS = ("phases", "patterns", "overlap", "causes", "critical-path", "balance", "energy", "report",
         "compare", "diff", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="analyze", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        importlib.import_module(f"analyze.cli.{verb.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # before any thread or large array exists: this process keeps the memory it frees
    heap.keep_freed_memory()
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
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
