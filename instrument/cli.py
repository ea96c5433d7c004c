"""``instrument``: run training scripts under the tracer, and merge per-rank traces.

Thin verbs over library functions: each parses its arguments and calls one function a
notebook user could call too. Errors the user can fix print one sentence and exit non-zero.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from instrument import launch, merge, runinfo, scorep_merge
from instrument.errors import UsageError
from instrument.hooks import horovod_timeline
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
                   help="builtin (default), scorep (as --scorep) or none for an uninstrumented baseline")
    p.add_argument("--scorep", dest="tracer", action="store_const", const="scorep",
                   help="trace with Score-P (Python bindings) instead of the built-in tracer; see docs/scorep.md")
    p.add_argument("--scorep-args", metavar="'ARGS'", default="",
                   help="extra options for `python -m scorep`, quoted as one argument: "
                   "--scorep-args='--instrumenter-type=cTrace'")
    p.add_argument("--scorep-filter", metavar="FILE",
                   help="Score-P filter file instead of ours (which keeps only the script's own "
                   "functions and the markers); 'none' records every Python function")
    p.add_argument("--launcher", choices=launch.LAUNCHERS, default="local",
                   help="how ranks start: ourselves (local, default), torchrun, horovodrun, mpirun "
                   "or srun; see docs/launchers.md")
    p.add_argument("--launcher-args", metavar="'ARGS'", default="",
                   help="options for the launcher, quoted as one argument (hosts, nodes); they replace "
                   "our single-node defaults: --launcher-args='-H node1:4,node2:4'")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="after a rank fails, wait this long before stopping the others")
    p.add_argument("--horovod-timeline", action="store_true",
                   help="also record Horovod's own timeline and import it into the trace "
                   "(costs about a core on rank 0; docs/horovod.md)")
    p.add_argument("script", help="the training script, run unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_cmd_run)


def _cmd_run(ns: argparse.Namespace, argv: list[str]) -> int:
    config = launch.LaunchConfig(
        script=ns.script, args=ns.args, nprocs=ns.nprocs, name=ns.name, out=ns.out,
        tracer=ns.tracer, launcher=ns.launcher, grace_s=ns.grace,
        launcher_args=shlex.split(ns.launcher_args), scorep_args=shlex.split(ns.scorep_args),
        scorep_filter=ns.scorep_filter,
        env={horovod_timeline.OPT_IN: "1"} if ns.horovod_timeline else {},
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
    collect = scorep_merge.collect if info.get("tracer") == "scorep" else merge.collect
    try:
        result = collect(ns.run_dir, expected_ranks=info.get("ranks"))
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    archive = write_archive(result.spec, ns.run_dir)
    print(f"trace written: {archive}  ({len(result.ranks)} ranks, {result.events:,} events)"
          + ("" if result.complete else "  [incomplete]"))
    return 0


def _sweep_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="run a designed experiment: every configuration, replicated, randomized",
        description="Run every configuration of DESIGN (a TOML file of factors and levels; see "
        "docs/experiments.md) REPLICATIONS times in an order randomized from its seed, one run "
        "directory per replication under OUT/<name>/. Running it again resumes: complete runs "
        "are skipped.")
    p.add_argument("design", type=Path, metavar="DESIGN", help="the design file (runs/designs/*.toml)")
    p.add_argument("--out", type=Path, default=Path("traces/sweeps"),
                   help="where sweep directories go (default traces/sweeps/)")
    p.add_argument("--name", help="sweep directory name (default: the design's name)")
    p.add_argument("--retry-failed", action="store_true", help="also rerun runs that failed before")
    p.add_argument("--show-output", action="store_true",
                   help="print the ranks' output (default: into each run's output.log)")
    p.add_argument("--dry-run", action="store_true", help="print the run order and stop")
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument import design, sweep

    plan_of = design.load(ns.design)
    if ns.dry_run:
        for spec in plan_of.plan():
            print(f"{spec.order:>4}  {spec.name}  (-np {spec.nprocs} {spec.script} {' '.join(spec.args)})")
        return 0
    result = sweep.run(plan_of, ns.out, name=ns.name, retry_failed=ns.retry_failed,
                       show_output=ns.show_output, command=["instrument", *argv])
    done = len(result.ran) + len(result.skipped) - len(result.failed)
    print(f"sweep {result.sweep_dir}: {done} of {result.planned} runs complete, "
          f"{len(result.failed)} failed" + (": " + ", ".join(result.failed[:5]) + (
              ", ..." if len(result.failed) > 5 else "") if result.failed else ""))
    if result.interrupted:
        print("interrupted: run the same command again to resume", file=sys.stderr)
    elif result.failed:
        print("failed runs are kept with their output.log; --retry-failed reruns them", file=sys.stderr)
    print(f"next: analyze compare {result.sweep_dir}")
    return result.exit_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="instrument", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    _run_parser(sub)
    _merge_parser(sub)
    _sweep_parser(sub)
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
