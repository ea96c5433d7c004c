"""``analyze``: read traces into DuckDB and report where the time goes.

Thin verbs over library functions; errors a user can fix print one sentence and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb

from analyze import background, database, phases


def _phases_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "phases", help="per rank and step: compute, allreduce, other communication and idle time",
        description="Read RUN's OTF2 archive (ours or Score-P's) into RUN/trace.duckdb and print "
        "the phase breakdown per rank.")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory, Score-P experiment or .otf2 file")
    p.add_argument("--force", action="store_true", help="rebuild the database even if it is current")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when the trace has no step markers")
    p.add_argument("--db", type=Path, help="database file (default RUN/trace.duckdb)")
    p.set_defaults(func=_cmd_phases)


def _cmd_phases(ns: argparse.Namespace) -> int:
    paths = database.build(ns.run, db=ns.db, force=ns.force, step_region=ns.step_region)
    with duckdb.connect(str(paths.db), read_only=True) as con:
        table = phases.summary(con)
        source = con.execute("SELECT value FROM build_info WHERE key = 'step_source'").fetchone()
        horovod = background.summary(con) if background.available(con) else None
    print(table.to_string(index=False, na_rep="0.0"))
    if horovod is not None and not horovod.empty:
        print("\nHorovod's background thread (its timeline; overlapping activities, see docs/horovod.md):")
        print(horovod.to_string(index=False, na_rep="-"))
    if source and source[0] == "whole_run":
        print("steps: no step markers found; each rank's whole trace is one step "
              "(use --step-region NAME to split it)")
    print(f"database: {_display(paths.db)}")
    return 0


def _report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="figures of one or more runs as a multi-page PDF",
        description="Build (or reuse) each RUN's database and write a PDF: the bottleneck "
        "comparison of all runs, then per run its timeline, per-step breakdown and collective "
        "waits. A sweep directory (instrument sweep) gets its scaling, phase, model and "
        "prediction pages instead (docs/experiments.md).")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories or archives")
    p.add_argument("-o", "--output", type=Path, default=Path("reports/report.pdf"),
                   help="the PDF to write (default reports/report.pdf)")
    p.add_argument("--steps", metavar="A:B",
                   help="timeline window: steps A to B-1 (default: a few steps after warm-up)")
    p.add_argument("--png", action="store_true", help="also write one PNG per page beside the PDF")
    p.add_argument("--force", action="store_true", help="rebuild the databases")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when a trace has no step markers")
    p.set_defaults(func=_cmd_report)


def _cmd_report(ns: argparse.Namespace) -> int:
    from reports.report import build_report, parse_steps  # plotnine loads only for reports

    steps = parse_steps(ns.steps) if ns.steps else None
    report = build_report(ns.runs, ns.output, steps=steps, png=ns.png, force=ns.force,
                          step_region=ns.step_region)
    for note in report.notes:
        print(f"note: {note}")
    print(f"report written: {_display(report.pdf)}  ({len(report.pages)} pages)")
    for png in report.pngs:
        print(f"  {_display(png)}")
    return 0


def _compare_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="one table across a sweep's runs: means, CIs, speedup, models",
        description="Build (or reuse) the database of every run under SWEEP (the directory "
        "instrument sweep wrote) and write SWEEP/compare.duckdb: per-run and per-configuration "
        "means with 95%% confidence intervals, speedup and efficiency, allocation of variation, "
        "fits against ranks and an allreduce model with hold-out predictions.")
    p.add_argument("sweep", type=Path, metavar="SWEEP", help="sweep directory (or any directory of runs)")
    p.add_argument("--predict-ranks", metavar="P,Q", type=_int_list, default=[],
                   help="also predict allreduce time per step at these rank counts")
    p.add_argument("--force", action="store_true", help="rebuild the runs' databases")
    p.set_defaults(func=_cmd_compare)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts such as 4,8, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive rank counts such as 4,8, not {text!r}")
    return values


def _cmd_compare(ns: argparse.Namespace) -> int:
    from analyze import compare

    result = compare.compare(ns.sweep, force=ns.force, predict_ranks=ns.predict_ranks)
    print(compare.text(result))
    print(f"database: {_display(result.db)}")
    return 0


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="analyze", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    _phases_parser(sub)
    _report_parser(sub)
    _compare_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(ns.func(ns))
    except database.AnalyzeError as e:
        print(f"analyze: {e}", file=sys.stderr)
        return e.exit_status


if __name__ == "__main__":
    sys.exit(main())
