"""``instrument``: run training scripts under the tracer, and merge per-rank traces.

Thin verbs over library functions: each parses its arguments and calls one function a
notebook user could call too. Errors the user can fix print one sentence and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from instrument import launch, merge, runinfo
from instrument.errors import UsageError
from instrument.otf2_writer import write_archive


def _run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script on N ranks and trace it",
        description="Run SCRIPT on N local ranks (or through another launcher) with the "
        "tracer attached, and write traces/<run>/traces.otf2 and run.json.",
    )
    p.add_argument("-np", "--nprocs", type=int, default=1, metavar="N", help="number of ranks (default 1)")
    p.add_argument("--name", help="run name (default run-NNNN); a taken name gets -2, -3, ...")
    p.add_argument("--out", type=Path, default=Path("traces"), help="output directory (default traces/)")
    p.add_argument("--tracer", choices=launch.TRACERS, default="builtin",
                   help="builtin (default) or none for an uninstrumented baseline")
    p.add_argument("--launcher", choices=launch.LAUNCHERS, default="local",
                   help="start ranks ourselves (local, default) or through torchrun")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="after a rank fails, wait this long before stopping the others")
    p.add_argument("script", help="the training script, run unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_cmd_run)


def _cmd_run(ns: argparse.Namespace, argv: list[str]) -> int:
    config = launch.LaunchConfig(
        script=ns.script, args=ns.args, nprocs=ns.nprocs, name=ns.name, out=ns.out,
        tracer=ns.tracer, launcher=ns.launcher, grace_s=ns.grace,
        command_line=["instrument", *argv],
    )
    result = launch.run(config)
    print(result.message, file=sys.stderr if result.exit_status else sys.stdout, flush=True)
    return result.exit_status


def _merge_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="(re)build a run's OTF2 archive from its per-rank files",
                       description="Build RUN/traces.otf2 from whatever per-rank files exist "
                       "(after a killed job, or ranks started by your own launcher).")
    p.add_argument("run_dir", type=Path, metavar="RUN")
    p.set_defaults(func=_cmd_merge)


def _cmd_merge(ns: argparse.Namespace, argv: list[str]) -> int:
    if not ns.run_dir.is_dir():
        raise UsageError(f"run directory not found: {ns.run_dir}")
    info = runinfo.read(ns.run_dir)
    try:
        result = merge.collect(ns.run_dir, expected_ranks=info.get("ranks"))
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    archive = write_archive(result.spec, ns.run_dir)
    print(f"trace written: {archive}  ({len(result.ranks)} ranks, {result.events:,} events)"
          + ("" if result.complete else "  [incomplete]"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="instrument", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    _run_parser(sub)
    _merge_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    try:
        return int(ns.func(ns, argv))
    except UsageError as e:
        print(f"instrument: {e}", file=sys.stderr)
        return e.exit_status


if __name__ == "__main__":
    sys.exit(main())
