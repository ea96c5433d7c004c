"""``instrument run``: start the ranks, watch them, merge their traces.

The local launcher starts N ranks on this machine with the environment torchrun gives
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
on a free port). Each rank runs ``python -m instrument.bootstrap SCRIPT ARGS`` (or the plain
script with ``--tracer none``), in its own session so that signals reach it only through us.

- Output: every line a rank prints is prefixed with ``[rank N]``.
- Failure: when a rank exits non-zero, the others get ``grace_s`` seconds to notice (their
  collectives usually fail at once when a peer's connections close), then SIGTERM, then
  SIGKILL. The exit status is non-zero and the message names the failed ranks.
- Signals: SIGINT or SIGTERM to the launcher is forwarded to all ranks, which flush their
  traces; a second SIGINT kills them at once (their spill files stay).
- Afterwards ``traces.otf2`` is assembled from the ranks' own event files (converting the
  spill files of ranks that could not write theirs: instrument/tracer/perrank.py), or merged
  from every rank's spill file in this process, and ``run.json`` is written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from instrument.errors import UsageError
from instrument.launch import rank_env, rundir, runinfo
from instrument.launch.options import LAUNCHERS, TRACERS
from instrument.scorep import backend as scorep
from instrument.scorep import merge as scorep_merge
from instrument.tracer import merge, perrank
from instrument.tracer.clock import ClockServer
from traceio.otf2_writer import write_archive

# What an external launcher must pass to every rank (Open MPI's mpirun exports only what -x names).
EXPORTED = ("DLTRACE_RUN_DIR", "DLTRACE_TRACER", "DLTRACE_CLOCK_SERVER", "PYTHONPATH", "PYTHONUNBUFFERED",
            "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "DLTRACE_POWERCAP_ROOT", "DLTRACE_POWER",
            "DLTRACE_POWER_INTERVAL_S")


@dataclass
class LaunchConfig:
    script: str
    args: list[str] = field(default_factory=list)
    nprocs: int = 1
    name: str | None = None
    out: Path = Path("traces")
    tracer: str = "builtin"
    launcher: str = "local"
    grace_s: float = 10.0
    launcher_args: list[str] = field(default_factory=list)  # passed to the external launcher
    scorep_args: list[str] = field(default_factory=list)  # passed to `python -m scorep`
    scorep_filter: str | None = None  # a Score-P filter file; None: ours; "none": no filter
    env: dict[str, str] = field(default_factory=dict)
    command_line: list[str] = field(default_factory=list)
    # called with the new run directory; returns the script to run instead and what to add to
    # run.json (``instrument run --horovodize`` writes the converted script there)
    prepare: Callable[[Path], tuple[str, dict[str, Any]]] | None = None


@dataclass
class LaunchResult:
    run_dir: Path
    exit_status: int
    rank_exit: dict[int, int | None]
    failed_ranks: list[int]
    interrupted: str | None
    merge: merge.MergeResult | None
    archive: Path | None
    message: str


def rank_command(config: LaunchConfig) -> list[str]:
    """The command each rank runs (the launcher decides how it is started)."""
    if config.tracer == "none":
        return [sys.executable, config.script, *config.args]
    if config.tracer == "scorep":
        return scorep.rank_command(config.launcher, config.scorep_args, config.script, config.args)
    return [sys.executable, "-m", "instrument.bootstrap", config.script, *config.args]


def launcher_command(config: LaunchConfig, port: int, env: dict[str, str] | None = None) -> list[str] | None:
    """The external launcher's command line (None for the local launcher). ``env`` is the
    environment the launcher gets: mpirun exports those of our variables that it holds.

    Without ``launcher_args`` the job is single-node; with them (hosts, node counts, rendezvous
    endpoints) they replace our single-node defaults, so the same command spans nodes.
    """
    inner = rank_command(config)
    n = str(config.nprocs)
    extra = list(config.launcher_args)
    if config.launcher == "local":
        return None
    if config.launcher == "torchrun":
        single = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
        # torchrun starts the interpreter itself: give it the module (-m) or script and args
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", n,
                *(extra or single), *inner[1:]]
    if config.launcher == "horovodrun":
        # next to our interpreter when the venv is not on PATH (as check_launcher accepts)
        horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))
        return [horovodrun, "-np", n, *(extra or ["-H", f"localhost:{n}"]), "--gloo", *inner]
    if config.launcher == "mpirun":
        names = [v for v in (*EXPORTED, *sorted(config.env)) if env is None or v in env]
        exports = [a for v in names for a in ("-x", v)]
        return ["mpirun", "-np", n, *exports, *extra, *inner]
    if config.launcher == "srun":
        return ["srun", f"--ntasks={n}", "--export=ALL", *extra, *inner]
    raise UsageError(f"unknown launcher {config.launcher!r}; choose one of {', '.join(LAUNCHERS)}.")


_INSTALL_HINT = {
    "horovodrun": "Horovod is installed by `make setup` (tools/build_horovod.sh)",
    "mpirun": "install an MPI (Debian: openmpi-bin) or load your cluster's MPI module",
    "srun": "srun exists only on Slurm clusters; run inside an allocation (salloc/sbatch)",
}


def check_launcher(config: LaunchConfig) -> None:
    """Fail before anything starts when the external launcher is not installed."""
    tool = {"horovodrun": "horovodrun", "mpirun": "mpirun", "srun": "srun"}.get(config.launcher)
    if tool and shutil.which(tool) is None and not Path(sys.executable).with_name(tool).exists():
        raise UsageError(f"--launcher {config.launcher}: {tool} not found on PATH; "
                         f"{_INSTALL_HINT[tool]}, or use --launcher local.")
    if config.launcher == "mpirun" and os.geteuid() == 0 and _openmpi_refuses_root(config):
        raise UsageError("--launcher mpirun: Open MPI refuses to run as root; add "
                         "--launcher-args=--allow-run-as-root, or set OMPI_ALLOW_RUN_AS_ROOT=1 and "
                         "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (as in containers), or run as a normal user.")


def _openmpi_refuses_root(config: LaunchConfig) -> bool:
    """Open MPI's mpirun stops at once as root unless told otherwise; other MPIs do not care."""
    if "--allow-run-as-root" in config.launcher_args:
        return False
    env = {**os.environ, **config.env}
    if env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1" and env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1":
        return False
    try:
        version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in version.stdout + version.stderr


class _Output:
    """Copies a child's output to ours, one prefixed line at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def pump(self, stream: IO[bytes], sink: Any, prefix: str) -> None:
        tag = prefix.encode()

        def run() -> None:
            for line in iter(stream.readline, b""):
                with self._lock:
                    sink.buffer.write(tag + line if line.endswith(b"\n") else tag + line + b"\n")
                    sink.flush()
            stream.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join(timeout=5)


class _Signals:
    """Forwards SIGINT/SIGTERM to the ranks; a second SIGINT kills them."""

    def __init__(self, forward: Callable[[int], None], kill: Callable[[], None]):
        self.received: str | None = None
        self._forward, self._kill = forward, kill
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            print("dltrace: second interrupt: killing all ranks now", file=sys.stderr, flush=True)
            self._kill()
            return
        self.received = self.received or name
        print(f"dltrace: {name}: stopping all ranks (they flush their traces)", file=sys.stderr, flush=True)
        self._forward(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)


def run(config: LaunchConfig) -> LaunchResult:
    """Launch, wait, merge. Raises :class:`UsageError` for problems before any rank starts."""
    if not Path(config.script).is_file():
        raise UsageError(f"training script not found: {config.script}")
    if config.nprocs < 1:
        raise UsageError("-np must be at least 1")
    if config.tracer not in TRACERS:
        raise UsageError(f"unknown tracer {config.tracer!r}; choose one of {', '.join(TRACERS)}.")
    if config.launcher not in LAUNCHERS:
        raise UsageError(f"unknown launcher {config.launcher!r}; choose one of {', '.join(LAUNCHERS)}.")
    check_launcher(config)
    if config.tracer == "scorep":  # before anything starts: never a partial launch
        scorep.check_available(scorep.is_mpi(scorep.options(config.launcher, config.scorep_args)))
        scorep.check_filter(config.scorep_filter)
    run_dir = rundir.create(config.out, config.name).resolve()
    prepared: dict[str, Any] = {}
    if config.prepare is not None:
        script, prepared = config.prepare(run_dir)
        config = replace(config, script=script)
    if config.tracer == "scorep":
        opts = scorep.options(config.launcher, config.scorep_args)
        extra = scorep.environment(run_dir, opts, scorep.write_filter(run_dir, config.scorep_filter))
        config = replace(config, env={**config.env, **extra})
    local = config.launcher == "local"
    providers = [cls() for cls in rank_env.PROVIDERS] if local else []
    for provider in providers:
        provider.start(config.nprocs)
    port = rank_env.free_port()

    # Ranks on other nodes must reach the reference clock: listen on all interfaces then.
    clock = None
    base = dict(os.environ)
    base.update(config.env)
    base["DLTRACE_RUN_DIR"] = str(run_dir)
    base["DLTRACE_TRACER"] = config.tracer
    base["PYTHONUNBUFFERED"] = "1"
    if config.tracer != "none":
        clock = ClockServer(host="127.0.0.1" if local else "0.0.0.0").start()
        host = "127.0.0.1" if local else socket.gethostname()
        base["DLTRACE_CLOCK_SERVER"] = f"{host}:{clock.port}"
    if config.launcher in ("mpirun", "srun"):
        # torch.distributed's env:// rendezvous, for DDP scripts started by MPI or Slurm
        base.setdefault("MASTER_ADDR", socket.gethostname())
        base.setdefault("MASTER_PORT", str(port))
    if config.launcher == "horovodrun" and not config.launcher_args:
        # One node, as with our launcher: ranks must not each start a thread per core.
        base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // config.nprocs)))
    outer = launcher_command(config, port, base)

    info: dict[str, Any] = {
        "name": run_dir.name,
        "command": config.command_line,
        "script": config.script,
        "script_args": config.args,
        "params": runinfo.params_from_args(config.args),
        "ranks": config.nprocs,
        "launcher": config.launcher,
        "tracer": config.tracer,
        "host": socket.gethostname(),
        "start": runinfo.now_iso(),
        "end": None,
        "status": "running",
        **prepared,
    }
    runinfo.write(run_dir, info)

    output = _Output()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    if outer is None:
        for rank in range(config.nprocs):
            env = dict(base)
            for provider in providers:
                env.update(provider.env(rank, config.nprocs))
            procs[rank] = subprocess.Popen(
                rank_command(config), env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
            output.pump(procs[rank].stdout, sys.stdout, f"[rank {rank}] ")  # type: ignore[arg-type]
            output.pump(procs[rank].stderr, sys.stderr, f"[rank {rank}] ")  # type: ignore[arg-type]
    else:
        procs[-1] = subprocess.Popen(outer, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        output.pump(procs[-1].stdout, sys.stdout, f"[{config.launcher}] ")  # type: ignore[arg-type]
        output.pump(procs[-1].stderr, sys.stderr, f"[{config.launcher}] ")  # type: ignore[arg-type]

    def forward(signum: int) -> None:
        for p in procs.values():
            _signal_group(p, signum)

    def kill() -> None:
        forward(signal.SIGKILL)

    first_failure: float | None = None
    terminated_at: float | None = None
    exited: dict[int, float] = {}  # rank -> when we saw it exit, to name the first failure
    with _Signals(forward, kill) as signals:
        while any(p.poll() is None for p in procs.values()):
            time.sleep(0.05)
            codes = {r: p.poll() for r, p in procs.items()}
            for r, c in codes.items():
                if c is not None and r not in exited:
                    exited[r] = time.monotonic()
            if first_failure is None and any(c not in (None, 0) for c in codes.values()):
                first_failure = time.monotonic()
            now = time.monotonic()
            if first_failure is not None and terminated_at is None and now - first_failure > config.grace_s:
                forward(signal.SIGTERM)
                terminated_at = now
            if terminated_at is not None and now - terminated_at > config.grace_s:
                kill()
        interrupted = signals.received
    output.join()
    if clock is not None:
        clock.stop()
    for provider in providers:
        provider.stop()

    rank_exit = {r: p.returncode for r, p in procs.items()}
    order = sorted(rank_exit, key=lambda r: exited.get(r, float("inf")))
    return _finish(config, run_dir, info, rank_exit, interrupted, order)


def build_archive(run_dir: Path, expected_ranks: int | None, tracer: str,
                  merged: bool = False) -> tuple[merge.MergeResult, Path]:
    """The run's ``traces.otf2``: from the ranks' own event files (per-rank writing, the
    default for our tracer where the codec is built), else by merging every rank's records in
    this process (Score-P runs, ``merged``, ``DLTRACE_TRACE_WRITING=merged``). Raises
    :class:`merge.MergeError` when there is nothing usable."""
    if tracer == "scorep":
        result = scorep_merge.collect(run_dir, expected_ranks=expected_ranks)
    elif not merged and perrank.enabled():
        return perrank.assemble(run_dir, expected_ranks)
    else:
        result = merge.collect(run_dir, expected_ranks=expected_ranks)
    return result, write_archive(result.spec, run_dir)


def _finish(
    config: LaunchConfig, run_dir: Path, info: dict[str, Any], rank_exit: dict[int, int | None],
    interrupted: str | None, exit_order: list[int],
) -> LaunchResult:
    result: merge.MergeResult | None = None
    archive: Path | None = None
    merge_error = None
    if config.tracer != "none":
        try:
            result, archive = build_archive(run_dir, config.nprocs, config.tracer)
        except merge.MergeError as e:
            merge_error = str(e)

    per_rank = {s.rank: s for s in result.ranks} if result else {}
    if -1 in rank_exit:  # an external launcher: rank statuses come from the ranks' own files
        launcher_status = rank_exit[-1]
        failed = [s.rank for s in per_rank.values() if s.status not in ("ok",)]
        if launcher_status and not failed:
            failed = [-1]
    else:
        launcher_status = None
        failed = [r for r in exit_order if rank_exit[r] not in (0, None)]  # first failure first

    rank_info = []
    for rank in range(config.nprocs):
        s = per_rank.get(rank)
        entry: dict[str, Any] = {"rank": rank, "exit_status": rank_exit.get(rank, launcher_status)}
        if s is not None:
            entry.update(
                host=s.host, pid=s.pid, status=s.status, status_detail=s.status_detail,
                events=s.events, steps=s.steps, complete=s.complete,
                open_regions_closed=s.open_regions_closed, unmatched_leaves=s.unmatched_leaves,
                records_dropped=s.records_dropped, partial_bytes=s.partial_bytes,
                last_time_ns=s.last_time_ns, gpu=(s.extra.get("gpu") or {}).get("device"),
            )
            if "device_activity" in s.extra:  # --device-activity: what torch.profiler gave
                entry["device_activity"] = s.extra["device_activity"]
        elif config.tracer != "none":
            entry.update(status="missing", complete=False)
        code = entry["exit_status"]
        if isinstance(code, int) and code < 0 and entry.get("status") in (None, "running", "missing"):
            # Killed by a signal it could not handle (SIGKILL: the OOM killer, a batch system):
            # its trace ends at its last flush.
            entry.update(status="killed", status_detail=f"killed by {_signal_name(-code)}"
                         + ("; trace ends at its last flush" if s is not None else ""))
        elif isinstance(code, int) and code < 0 and entry.get("status") == "ok":
            # The script returned and the trace was finalized; the process died while Python
            # shut down (PyTorch gloo's worker threads can abort there: runs/gloo_exit.py).
            entry.update(status="died_at_exit", status_detail=f"killed by {_signal_name(-code)} after "
                         "its script finished; its trace is complete")
        rank_info.append(entry)

    frameworks = sorted({f for s in per_rank.values() for f in s.frameworks})
    versions: dict[str, str] = {}
    for s in per_rank.values():
        versions.update(s.extra.get("versions", {}))
    status = "interrupted" if interrupted else ("failed" if failed else "ok")
    info.update(
        end=runinfo.now_iso(),
        status=status,
        interrupted_by=interrupted,
        failed_ranks=failed,
        exit_status={str(r): c for r, c in rank_exit.items()},
        rank_info=rank_info,
        framework=_framework_label(frameworks),
        frameworks=frameworks,
        versions=versions,
        # a rank that died after its script finished (and its trace was finalized) lost nothing
        complete=bool(result and result.complete and not interrupted
                      and all(e.get("status") == "died_at_exit" for e in rank_info if e["rank"] in failed)
                      and all(r >= 0 for r in failed)),
        trace=None if archive is None else {
            "archive": archive.name,
            "events": result.events if result else 0,
            "missing_ranks": result.missing_ranks if result else [],
        },
        merge_error=merge_error,
        power=_power(config, per_rank),
    )
    runinfo.write(run_dir, info)

    exit_status = 0
    if interrupted:
        exit_status = 128 + int(getattr(signal, interrupted))
    elif failed:
        exit_status = 1
    return LaunchResult(run_dir, exit_status, rank_exit, failed, interrupted, result, archive,
                        _message(config, run_dir, info, result, archive, failed, merge_error))


def _power(config: LaunchConfig, per_rank: dict[int, merge.RankSummary]) -> dict[str, Any]:
    """What each host's power sampler found (channels, unusable sources and why)."""
    if config.tracer == "scorep":
        return {"sampled": False, "reason": "not sampled with --scorep: use Score-P's metric plugins "
                "(docs/energy.md)"}
    hosts = {}
    for s in sorted(per_rank.values(), key=lambda s: s.rank):
        power = s.extra.get("power")
        if power and power.get("host") not in hosts:
            hosts[power.get("host")] = {"rank": s.rank, **power}
    return {"hosts": hosts}


def _power_line(power: dict[str, Any] | None) -> str | None:
    """One line about power for the console: what was sampled, or why nothing was."""
    if not power:
        return None
    if "reason" in power:
        return f"power: {power['reason']}"
    hosts = power.get("hosts", {})
    if not hosts:
        return None
    if all(h.get("reason") == "--power off" for h in hosts.values()):
        return None
    sampled = {h: p for h, p in hosts.items() if p.get("sampled")}
    parts = []
    if sampled:
        channels = sorted({c["name"] for p in sampled.values() for c in p.get("channels", [])})
        interval = next(iter(sampled.values())).get("interval_s")
        parts.append(f"sampled every {interval:g} s on {len(sampled)} host(s): {', '.join(channels)}")
    for host, p in hosts.items():
        if not p.get("sampled") and p.get("reason") != "--power off":
            why = "; ".join(f"{u['source']}: {u['reason']}" for u in p.get("unavailable", []))
            parts.append(f"not sampled on {host} ({why or 'no source'})")
    errors = [f"{e['source']}: {e['reason']}" for p in hosts.values() for e in p.get("read_errors", [])]
    if errors:
        parts.append("read errors: " + "; ".join(errors))
    return "power: " + "; ".join(parts)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _framework_label(frameworks: list[str]) -> str | None:
    """The most specific framework seen (``pytorch-ddp`` over ``pytorch``)."""
    if not frameworks:
        return None
    return max(frameworks, key=len)


def _message(
    config: LaunchConfig, run_dir: Path, info: dict[str, Any], result: merge.MergeResult | None,
    archive: Path | None, failed: list[int], merge_error: str | None,
) -> str:
    lines = []
    if failed:
        details = []
        for r in failed:
            entry: dict[str, Any] = next((e for e in info["rank_info"] if e["rank"] == r), {})
            what = entry.get("status_detail") or f"exit status {entry.get('exit_status')}"
            details.append(f"rank {r} ({what})" if r >= 0 else f"{config.launcher} ({what})")
        lines.append("failed: " + details[0] + ("" if len(details) == 1 else
                     "; then " + ", ".join(details[1:])))
    if info.get("interrupted_by"):
        lines.append(f"interrupted by {info['interrupted_by']}")
    if archive is not None and result is not None:
        steps = sorted({s.steps for s in result.ranks})
        step_text = counted(steps[0], "step") if len(steps) == 1 else "steps " + "/".join(
            str(s.steps) for s in result.ranks)
        flag = "" if info["complete"] else "  [incomplete: see run.json]"
        lines.append(
            f"trace written: {_display(archive)}  ({counted(len(result.ranks), 'rank')}, {step_text}, "
            f"{result.events:,} events){flag}"
        )
    elif config.tracer == "none":
        lines.append(f"run recorded without a trace: {_display(run_dir / runinfo.RUN_JSON)}")
    if merge_error:
        lines.append(f"no trace: {merge_error}")
    power = _power_line(info.get("power")) if archive is not None else None
    if power:
        lines.append(power)
    return "\n".join(lines)


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def counted(n: int, noun: str) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
