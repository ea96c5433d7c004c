"""``instrument run``: run a training script on N ranks with the tracer and merge the trace."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from instrument.launch.options import LAUNCHERS, TRACERS


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script on N ranks and trace it",
        description="Run SCRIPT on N local ranks (or through another launcher) with the "
        "tracer attached, and write traces/<run>/traces.otf2 and run.json.",
    )
    p.add_argument("-np", "--nprocs", type=int, default=1, metavar="N", help="number of ranks (default 1)")
    p.add_argument("--name", help="run name (default run-NNNN); a taken name gets -2, -3, ...")
    p.add_argument("--out", type=Path, default=Path("traces"), help="output directory (default traces/)")
    p.add_argument("--tracer", choices=TRACERS, default="builtin",
                   help="builtin (default), scorep (as --scorep) or none for an uninstrumented baseline")
    p.add_argument("--scorep", dest="tracer", action="store_const", const="scorep",
                   help="trace with Score-P (Python bindings) instead of the built-in tracer; see docs/scorep.md")
    p.add_argument("--scorep-args", metavar="'ARGS'", default="",
                   help="extra options for `python -m scorep`, quoted as one argument: "
                   "--scorep-args='--instrumenter-type=cTrace'")
    p.add_argument("--scorep-filter", metavar="FILE",
                   help="Score-P filter file instead of ours (which keeps only the script's own "
                   "functions and the markers); 'none' records every Python function")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="how ranks start: ourselves (local, default), torchrun, horovodrun, mpirun "
                   "or srun; see docs/launchers.md")
    p.add_argument("--launcher-args", metavar="'ARGS'", default="",
                   help="options for the launcher, quoted as one argument (hosts, nodes); they replace "
                   "our single-node defaults: --launcher-args='-H node1:4,node2:4'")
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS",
                   help="after a rank fails, wait this long before stopping the others")
    p.add_argument("--power", choices=("on", "off"), default="on",
                   help="sample CPU (RAPL) and GPU (NVML) power on every host where a source exists "
                   "(default on; docs/energy.md)")
    p.add_argument("--power-interval", type=float, default=None, metavar="SECONDS",
                   help="power sampling interval (default 0.1, or DLTRACE_POWER_INTERVAL_S)")
    p.add_argument("--horovod-timeline", action="store_true",
                   help="also record Horovod's own timeline and import it into the trace "
                   "(costs about a core on rank 0; docs/horovod.md)")
    p.add_argument("--horovodize", action="store_true",
                   help="convert the single-process SCRIPT into a Horovod one in the run directory "
                   "(instrument horovodize; the diff and report go to run.json) and run that")
    p.add_argument("--device-activity", action="store_true",
                   help="also run torch.profiler on each rank (CPU and GPU activity, no shapes or "
                   "stacks) and import its kernels, copies and NCCL kernels into the trace on the "
                   "run's clock; on a machine without a GPU, CPU activity only (docs/gpu.md)")
    p.add_argument("script", help="the training script, run unmodified")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(command=run)


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument.errors import UsageError
    from instrument.hooks import device_activity, horovod_timeline
    from instrument.launch import job

    if ns.power_interval is not None and not ns.power_interval > 0:
        raise UsageError(f"--power-interval must be a positive number of seconds, not {ns.power_interval}")
    env = {horovod_timeline.OPT_IN: "1"} if ns.horovod_timeline else {}
    if ns.power == "off":
        env["DLTRACE_POWER"] = "off"
    elif ns.power_interval is not None:
        env["DLTRACE_POWER_INTERVAL_S"] = repr(ns.power_interval)
    if ns.device_activity:
        if ns.tracer != "builtin":
            raise UsageError(f"--device-activity needs the built-in tracer, not --tracer {ns.tracer}; "
                             "drop one of the two.")
        env[device_activity.OPT_IN] = "1"
    prepare = None
    if ns.horovodize:
        prepare, env = _horovodize(ns.script, env)
    config = job.LaunchConfig(
        script=ns.script, args=ns.args, nprocs=ns.nprocs, name=ns.name, out=ns.out,
        tracer=ns.tracer, launcher=ns.launcher, grace_s=ns.grace,
        launcher_args=shlex.split(ns.launcher_args), scorep_args=shlex.split(ns.scorep_args),
        scorep_filter=ns.scorep_filter,
        env=env, command_line=["instrument", *argv], prepare=prepare,
    )
    result = job.run(config)
    print(result.message, file=sys.stderr if result.exit_status else sys.stdout, flush=True)
    return result.exit_status


def _horovodize(script: str, env: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """Convert now (a refusal stops here, before anything is created); write the result into
    the run directory once it exists. The converted script runs from there, so the original's
    directory goes on PYTHONPATH for the modules next to it."""
    import os

    from instrument.cli import horovodize

    text, info, _ = horovodize.for_run(script)
    here = str(Path(script).resolve().parent)
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}

    def prepare(run_dir: Path) -> tuple[str, dict[str, Any]]:
        out = run_dir / (Path(script).stem + "_hvd.py")
        out.write_text(text, encoding="utf-8")
        return str(out), {"horovodize": {**info, "script": str(out)}}

    return prepare, env
