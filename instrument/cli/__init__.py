"""``instrument``: run training scripts under the tracer, merge per-rank traces, run sweeps.

Thin verbs over library functions, one module per verb in this package: each defines
``add_parser(subparsers)`` (which sets ``command``) and ``run(namespace, argv) -> int`` and loads the library only
inside ``run``, so ``--help`` answers at once. A notebook user calls the same functions.
Errors the user can fix print one sentence and exit non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from instrument.errors import UsageError

# Verbs in the order ``instrument --help`` lists them; each is the module instrument.cli.<verb>.
VERBS = ("run", "merge", "sweep", "horovodize")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="instrument", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb in VERBS:
        importlib.import_module(f"instrument.cli.{verb}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    try:
        return int(ns.command(ns, argv))
    except UsageError as e:
        print(f"instrument: {e}", file=sys.stderr)
        return e.exit_status
    except OSError as e:  # a path the user gave that cannot be read or written
        if e.filename is None:
            raise
        print(f"instrument: {e.filename}: {e.strerror}; check the path and its permissions", file=sys.stderr)
        return 1
