"""Rank-side entry point: ``python -m instrument.bootstrap SCRIPT [ARGS...]``.

Runs an unmodified training script as ``__main__`` with the tracer active. The launcher (ours,
or torchrun / mpirun / srun / horovodrun) starts one of these per rank; all configuration
comes from the environment, so any launcher that passes the environment through works:

- ``DLTRACE_RUN_DIR``: the run directory (shared by all ranks; on several nodes it must be on
  a shared file system). Required.
- ``DLTRACE_CLOCK_SERVER``: ``host:port`` of the reference clock; without it, rank 0 serves
  its own clock and publishes the address in the run directory.
- ``DLTRACE_BUFFER_EVENTS``, ``DLTRACE_FLUSH_INTERVAL_S``: buffer size and periodic flush.
- ``DLTRACE_POWER`` (``off``), ``DLTRACE_POWER_INTERVAL_S``, ``DLTRACE_POWERCAP_ROOT``: the
  per-host power sampler (instrument/power; docs/energy.md).
- ``DLTRACE_DEVICE_ACTIVITY=1``: run torch.profiler beside the tracer (instrument/hooks/device_activity.py).
- rank and size: ``RANK``/``WORLD_SIZE`` (torchrun and our launcher), or Open MPI, PMI, Slurm
  and Horovod's variables.

The rank's end is recorded whatever happens: normal exit, an exception (recorded, then
re-raised so the exit status and traceback are the script's own), SIGTERM (flushed, then the
process dies of the signal) or SIGINT.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
import runpy
import signal
import sys
import time
from pathlib import Path
from types import FrameType, ModuleType

from instrument.hooks import device_activity, horovod_timeline
from instrument.hooks.importer import PostImportHooks
from instrument.launch.rank_env import RankEnvError, rank_from_env, torch_env
from instrument.power import sampler as power
from instrument.tracer import recorder
from instrument.tracer.builtin import DEFAULT_CAPACITY, DEFAULT_FLUSH_INTERVAL_S, Tracer
from instrument.tracer.clock import ClockServer, parse_address

CLOCK_FILE = "clock-server"


def _clock_server(rank: int, run_dir: Path, env: dict[str, str]) -> tuple[str, int] | None:
    """The reference clock's address; rank 0 serves one when the launcher does not."""
    if env.get("DLTRACE_CLOCK_SERVER"):
        return parse_address(env["DLTRACE_CLOCK_SERVER"])
    path = run_dir / CLOCK_FILE
    if rank == 0:
        server = ClockServer().start()
        host = env.get("MASTER_ADDR") or os.uname().nodename
        tmp = path.with_name(CLOCK_FILE + ".tmp")
        tmp.write_text(f"{host}:{server.port}")
        os.replace(tmp, path)
        return ("127.0.0.1", server.port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            return parse_address(path.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
    return None


def make_tracer(env: dict[str, str]) -> Tracer:
    run_dir = env.get("DLTRACE_RUN_DIR")
    if not run_dir:
        raise RankEnvError("DLTRACE_RUN_DIR is not set; start ranks with `instrument run`.")
    rank, size, local_rank = rank_from_env(env)
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    interval = float(env.get("DLTRACE_FLUSH_INTERVAL_S", DEFAULT_FLUSH_INTERVAL_S))
    backend: type[Tracer] = Tracer
    if env.get("DLTRACE_TRACER") == "scorep":  # running under Score-P's bindings
        from instrument.scorep import backend as scorep

        scorep.prepare_rank(env)
        backend = scorep.ScorepRecorder
    return backend(
        rank,
        size,
        path,
        capacity=int(env.get("DLTRACE_BUFFER_EVENTS", DEFAULT_CAPACITY)),
        flush_interval_s=interval if interval > 0 else None,
        clock_server=_clock_server(rank, path, env),
        local_rank=local_rank,
    )


def _versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "tensorflow", "horovod", "numpy", "mpi4py"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = str(getattr(module, "__version__", "?"))
    return out


# A module the training script may import -> the hook module (under instrument.hooks) whose
# ``install(recorder, module)`` attaches to it right after that import. Add a framework here.
HOOKS: dict[str, str] = {
    "torch": "torch_ddp",
    "horovod.torch": "horovod_torch",
    "tensorflow": "tensorflow",
    "horovod.tensorflow": "horovod_tf",
    "mpi4py.MPI": "mpi4py",
}


def install_hooks(rec: recorder.Recorder) -> PostImportHooks:
    """Attach framework hooks as the script imports the frameworks."""
    hooks = PostImportHooks()

    def attach(hook_module: str, module: ModuleType) -> None:
        importlib.import_module(f"instrument.hooks.{hook_module}").install(rec, module)

    for name, hook_module in HOOKS.items():
        hooks.on(name, functools.partial(attach, hook_module))
    return hooks


def _finish(tracer: Tracer, status: str, detail: str | None = None) -> None:
    horovod_timeline.import_at_exit(tracer)  # rank 0, when Horovod's timeline was requested
    # with --device-activity: torch.profiler's trace (not from a signal handler, which may
    # have interrupted the profiler itself)
    device_activity.import_at_exit(tracer, skip=status == "signal")
    tracer.set_meta("versions", _versions())
    tracer.finalize(status, detail)


def run(script: str, args: list[str]) -> None:
    """Run ``script`` with ``args`` as ``__main__`` under a tracer from the environment."""
    try:
        tracer = make_tracer(dict(os.environ))
    except RankEnvError as e:
        print(f"dltrace: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    recorder.install(tracer)
    os.environ.update(torch_env(dict(os.environ)))
    if os.environ.get("DLTRACE_TRACER") != "scorep":  # Score-P has its own metric plugins
        power.attach(tracer, dict(os.environ))
    tracer.sync_clock("start")
    horovod_timeline.request(os.environ, tracer.run_dir, tracer.rank)
    device_activity.request(os.environ, tracer, tracer.run_dir, tracer.rank, tracer.world_size)

    def on_term(signum: int, frame: FrameType | None) -> None:
        tracer.flush_timeout_s = 2.0  # the interrupted code may hold the buffer lock
        _finish(tracer, "signal", signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)

    # A forked child (DataLoader workers) must not write into this rank's spill file.
    os.register_at_fork(after_in_child=lambda: recorder.install(None))
    atexit.register(lambda: None if recorder.current() is not tracer else _finish(tracer, "ok"))
    install_hooks(tracer)

    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except KeyboardInterrupt:
        _finish(tracer, "signal", "SIGINT")
        raise
    except SystemExit as e:
        code = e.code
        if code in (None, 0):
            _finish(tracer, "ok")
        else:
            _finish(tracer, "exit", f"exit status {code}")
        raise
    except BaseException as e:
        _finish(tracer, "exception", f"{type(e).__name__}: {e}"[:500])
        raise
    _finish(tracer, "ok")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Run as a file (Score-P's bindings do that), this module's directory heads sys.path, and
    # its modules (scorep.py, events.py...) would shadow the script's imports of those names.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if not argv:
        print("usage: python -m instrument.bootstrap SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    run(argv[0], argv[1:])


if __name__ == "__main__":
    main()
