"""``instrument sweep``: run every configuration of a design, replicated, in randomized order.

The sweep directory (``traces/sweeps/<design name>/``) holds ``design.toml`` (a copy),
``sweep.json`` (the design, its factors and the run plan) and one run directory per
replication, named by its factor levels (``batch_size=32,ranks=2,rep=1``), whose ``run.json``
records ``factors`` and ``sweep`` (name, config, replication, order) beside what every run
records.

Resuming: the plan is a function of the design (the seed fixes the order), so running the
same design again skips runs whose ``run.json`` says ``ok``, skips failed runs unless
``retry_failed``, and reruns the rest (interrupted, or never finished because the sweep was
killed), deleting their partial directory first. A failing run is reported and the sweep
goes on; an interrupted run (Ctrl-C) stops the sweep, which the same command resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from instrument.errors import UsageError
from instrument.experiments.design import Design, RunSpec
from instrument.launch import job, rundir, runinfo

SWEEP_JSON = "sweep.json"
DESIGN_COPY = "design.toml"
LOG = "output.log"
DEFAULT_OUT = Path("traces/sweeps")

Launcher = Callable[[job.LaunchConfig], job.LaunchResult]


@dataclass
class SweepResult:
    sweep_dir: Path
    planned: int
    ran: list[str] = field(default_factory=list)  # names run to their end now (ok or failed)
    skipped: list[str] = field(default_factory=list)  # complete (or failed) before this call
    failed: list[str] = field(default_factory=list)  # failed now or before, in plan order
    interrupted: bool = False

    @property
    def exit_status(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)


def run_state(run_dir: Path) -> str:
    """``ok``, ``failed`` or ``incomplete`` (interrupted, still running, or never started)."""
    status = runinfo.read(run_dir).get("status")
    return status if status in ("ok", "failed") else "incomplete"


def sweep_dir(design: Design, out: Path = DEFAULT_OUT, name: str | None = None) -> Path:
    return Path(out) / rundir.check_name(name or design.name)


def describe(design: Design, plan: list[RunSpec]) -> dict[str, Any]:
    """What ``sweep.json`` holds: the design, its factors in order, the plan."""
    return {
        "name": design.name,
        "design_file": str(design.path),
        "digest": design.digest,
        "seed": design.seed,
        "replications": design.replications,
        "factors": [{"name": f.name, "levels": [lv.value for lv in f.levels]} for f in design.factors],
        "baselines": design.raw.get("baselines", {}),
        "design": design.raw,
        "plan": [{"order": s.order, "name": s.name, "config": s.config, "replication": s.replication,
                  "factors": s.factors} for s in plan],
    }


def check(plan: list[RunSpec]) -> None:
    """Everything that would stop a run before it starts, checked before the first run."""
    for spec in {(s.script, s.tracer, s.launcher): s for s in plan}.values():
        if not Path(spec.script).is_file():
            raise UsageError(f"training script not found: {spec.script} (paths are relative to "
                             f"{Path.cwd()}).")
        if spec.tracer not in job.TRACERS:
            raise UsageError(f"unknown tracer {spec.tracer!r}; choose one of {', '.join(job.TRACERS)}.")
        if spec.launcher not in job.LAUNCHERS:
            raise UsageError(f"unknown launcher {spec.launcher!r}; choose one of "
                             f"{', '.join(job.LAUNCHERS)}.")
        job.check_launcher(_config(spec, Path("."), []))


def _config(spec: RunSpec, out: Path, command: list[str]) -> job.LaunchConfig:
    return job.LaunchConfig(
        script=spec.script, args=list(spec.args), nprocs=spec.nprocs, name=spec.name, out=out,
        tracer=spec.tracer, launcher=spec.launcher, launcher_args=list(spec.launcher_args),
        env=dict(spec.env), command_line=command,
    )


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One sweep at a time per directory: a second one would rerun the first one's runs."""
    with open(directory / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another sweep is running in {directory}; wait for it or stop it.") from None
        yield


def _prepare(design: Design, directory: Path, plan: list[RunSpec]) -> None:
    existing = directory / SWEEP_JSON
    if existing.exists():
        try:
            old = json.loads(existing.read_text(encoding="utf-8"))
        except ValueError:
            old = {}
        if old.get("digest") != design.digest:
            raise UsageError(
                f"{directory} holds a sweep of a different design (factors, levels, seed or "
                "arguments changed); give this one another --name, or delete that directory.")
    tmp = existing.with_name(SWEEP_JSON + ".tmp")
    tmp.write_text(json.dumps(describe(design, plan), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, existing)
    if design.path.is_file():
        shutil.copyfile(design.path, directory / DESIGN_COPY)


def run(
    design: Design,
    out: Path = DEFAULT_OUT,
    *,
    name: str | None = None,
    retry_failed: bool = False,
    show_output: bool = False,
    command: list[str] | None = None,
    progress: TextIO | None = None,
    launcher: Launcher = job.run,
    clock: Callable[[], float] = time.monotonic,
) -> SweepResult:
    """Run ``design``'s plan under ``out/<name or design name>``; see the module docstring.

    Each run goes through ``launcher`` (:func:`instrument.launch.job.run`); its output goes to
    ``<run>/output.log`` unless ``show_output``. Progress lines go to ``progress`` (stdout).
    """
    plan = design.plan()
    check(plan)
    directory = sweep_dir(design, out, name)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the sweep directory {directory}: {e.strerror}.") from None
    progress = progress or sys.stdout
    result = SweepResult(directory, len(plan))
    with _locked(directory):
        _prepare(design, directory, plan)
        todo = []
        for spec in plan:
            state = run_state(directory / spec.name)
            if state == "ok" or (state == "failed" and not retry_failed):
                result.skipped.append(spec.name)
                if state == "failed":
                    result.failed.append(spec.name)
            else:
                todo.append(spec)
        failed_before = f" ({len(result.failed)} failed)" if result.failed else ""
        _say(progress, f"sweep {directory}: {len(plan)} runs ({len(design.configs)} configurations x "
                       f"{design.replications} replications), {len(result.skipped)} already done"
                       f"{failed_before}, {len(todo)} to run")
        durations: list[float] = []
        started = clock()
        try:
            for k, spec in enumerate(todo, start=1):
                shutil.rmtree(directory / spec.name, ignore_errors=True)
                t0 = clock()
                res = _one(spec, directory, design.name, show_output, command or [], launcher)
                durations.append(clock() - t0)
                if not res.interrupted:
                    result.ran.append(spec.name)
                word = "ok" if res.exit_status == 0 else ("interrupted" if res.interrupted else "FAILED")
                left = (len(todo) - k) * sum(durations) / len(durations)
                _say(progress, f"[{k + len(result.skipped):>{len(str(len(plan)))}}/{len(plan)}] "
                               f"{spec.name}  {word}  {durations[-1]:.1f} s  (elapsed "
                               f"{_clock(clock() - started)}, about {_clock(left)} left)")
                if res.interrupted:
                    result.interrupted = True
                    break
                if res.exit_status != 0:
                    result.failed.append(spec.name)
                    first = res.message.splitlines()[0] if res.message else f"exit status {res.exit_status}"
                    _say(progress, f"    {first}; output: {_display(directory / spec.name / LOG)}")
        except KeyboardInterrupt:  # between runs; during a run the launcher handles Ctrl-C
            result.interrupted = True
    order = {s.name: s.order for s in plan}
    result.failed.sort(key=order.__getitem__)
    return result


def _one(spec: RunSpec, directory: Path, sweep: str, show_output: bool, command: list[str],
         launcher: Launcher) -> job.LaunchResult:
    """Launch one run, then add its factor levels to its run.json."""
    config = _config(spec, directory, command)
    log = directory / f".{spec.name}.log"
    try:
        with contextlib.ExitStack() as stack:
            if not show_output:
                sink = stack.enter_context(open(log, "w", encoding="utf-8"))
                stack.enter_context(contextlib.redirect_stdout(sink))
                stack.enter_context(contextlib.redirect_stderr(sink))
            try:
                res = launcher(config)
            except UsageError as e:  # a problem only this run has: record it as failed
                run_dir = directory / spec.name
                run_dir.mkdir(exist_ok=True)
                runinfo.write(run_dir, {"name": spec.name, "script": spec.script, "script_args": spec.args,
                                        "ranks": spec.nprocs, "status": "failed", "error": str(e)})
                res = job.LaunchResult(run_dir, e.exit_status, {}, [], None, None, None, str(e))
    finally:
        if log.exists():
            target = directory / spec.name / LOG
            if target.parent.is_dir():
                log.replace(target)
            else:
                log.unlink()
    info = runinfo.read(res.run_dir)
    info["factors"] = spec.factors
    info["sweep"] = {"name": sweep, "config": spec.config, "replication": spec.replication,
                     "order": spec.order}
    runinfo.write(res.run_dir, info)
    return res


def _say(stream: TextIO, line: str) -> None:
    print(line, file=stream, flush=True)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
