"""The Score-P backend: ranks run under Score-P's Python bindings, our markers become user regions.

How a rank starts under ``instrument run --scorep``::

    launcher -> python -m instrument.scorep [SCORE-P OPTIONS] -- SCRIPT ARGS     (one per rank)
             -> checks Score-P on this node; without MPI, gives the rank its own experiment
             -> exec python -m scorep [--mpp=mpi] OPTIONS .../instrument/bootstrap.py SCRIPT ARGS
             -> the bindings re-exec Python with Score-P preloaded and run bootstrap.py, which
                makes a :class:`ScorepRecorder` (``DLTRACE_TRACER=scorep``) and runs the script.

What a run directory holds afterwards:

- ``scorep/``: one Score-P experiment (MPI launch: Score-P synchronizes the clocks), or
  ``scorep/rank-NNNNN/``, one experiment per rank (no MPI: each has its own clock);
- ``ranks/rank-NNNNN.*``: our side file, in the built-in tracer's spill format, with what user
  regions cannot carry: collective operations and bytes, asynchronous collectives (they end
  in the past, Score-P records only "now"), step discards, and clock samples that relate
  Score-P's timestamps to our reference clock;
- ``traces.otf2``: the archive ``analyze`` reads, made by :mod:`instrument.scorep.merge` from
  both, with our region names, roles and collective records, one location group per rank.

Score-P itself cannot be pip-installed (the ``scorep`` package on PyPI is only the bindings and
needs Score-P to build): :func:`check_available` says so before any rank starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any, Protocol

from instrument.errors import UsageError
from instrument.launch.rank_env import RankEnvError, rank_from_env
from instrument.tracer.builtin import Tracer
from instrument.tracer.clock import measure_offset
from traceio import records
from traceio.records import Kind

EXPERIMENT_DIR = "scorep"
FILTER_FILE = "scorep.filter"
MPP_VAR = "DLTRACE_SCOREP_MPP"  # "mpi" or "none": how the ranks' experiments are formed
# Launchers whose ranks are MPI processes by construction; with others, pass
# --scorep-args=--mpp=mpi to trace an MPI program as one experiment.
MPI_LAUNCHERS = ("mpirun",)
# The source file our user regions declare: a name no sensible filter excludes by file.
REGION_FILE = "dltrace"
DEFAULT_TOTAL_MEMORY = "64M"  # per process; Score-P's 16M default flushes often on Python traces
# The program the bindings run in each rank (a file: they take a script path, not a module).
BOOTSTRAP = Path(__file__).resolve().parents[1] / "bootstrap.py"

HOW_TO_GET = (
    "load your cluster's Score-P module (module load scorep), or install Score-P with Spack "
    "(spack install scorep) or from source (www.score-p.org), then the bindings with "
    "`pip install scorep`; or leave out --scorep to use dltrace's built-in tracer"
)


# -- availability -------------------------------------------------------------------------
def missing(mpi: bool = False) -> list[str]:
    """What this node lacks to run ranks under Score-P (empty when all is there)."""
    gaps = []
    if shutil.which("scorep-config") is None:
        gaps.append("scorep-config is not on PATH")
    if importlib.util.find_spec("scorep") is None:
        gaps.append(f"the Score-P Python bindings (module scorep) are not installed in {sys.prefix}")
    if mpi and importlib.util.find_spec("mpi4py") is None:
        gaps.append("mpi4py (needed for --mpp=mpi) is not installed")
    return gaps


def check_available(mpi: bool = False) -> None:
    """Raise :class:`UsageError` naming what is missing and how to get it."""
    gaps = missing(mpi)
    if gaps:
        raise UsageError(f"--scorep: Score-P is not available ({'; '.join(gaps)}); {HOW_TO_GET}.")


# -- commands and environment -----------------------------------------------------------------
def options(launcher: str, user_args: list[str]) -> list[str]:
    """Options for ``python -m scorep``: ``--mpp=mpi`` under an MPI launcher, then the user's
    (which win: a ``--mpp=`` of theirs replaces ours)."""
    ours = [] if any(a.startswith("--mpp=") or a == "--mpi" for a in user_args) else \
        ["--mpp=mpi" if launcher in MPI_LAUNCHERS else "--mpp=none"]
    return [*ours, *user_args]


def is_mpi(opts: list[str]) -> bool:
    return "--mpp=mpi" in opts or "--mpi" in opts


def rank_command(launcher: str, user_args: list[str], script: str, args: list[str]) -> list[str]:
    """What each rank runs: our per-rank entry, which execs the bindings (see :func:`main`)."""
    return [sys.executable, "-m", "instrument.scorep", *options(launcher, user_args), "--",
            script, *args]


def bindings_command(opts: list[str], script: str, args: list[str]) -> list[str]:
    """``python -m scorep OPTIONS bootstrap.py SCRIPT ARGS``: the bindings run our bootstrap as
    the program (their runner takes the first argument not starting with ``-``)."""
    return [sys.executable, "-m", "scorep", *opts, str(BOOTSTRAP),
            script, *args]


def environment(run_dir: Path, opts: list[str], filter_file: Path | None,
                env: dict[str, str] | None = None) -> dict[str, str]:
    """Score-P variables for every rank. Tracing and the experiment's place are ours; memory
    gives way to a value already set in ``env`` (default: the user's environment)."""
    user = dict(os.environ) if env is None else env
    out = {
        "SCOREP_ENABLE_TRACING": "true",
        "SCOREP_EXPERIMENT_DIRECTORY": str(Path(run_dir) / EXPERIMENT_DIR),
        "SCOREP_TOTAL_MEMORY": user.get("SCOREP_TOTAL_MEMORY", DEFAULT_TOTAL_MEMORY),
        MPP_VAR: "mpi" if is_mpi(opts) else "none",
    }
    if filter_file is not None:
        out["SCOREP_FILTERING_FILE"] = str(filter_file)
    return out


def default_filter() -> str:
    """A Score-P filter keeping the training script's own functions and our markers, and
    dropping the internals of the standard library, installed packages and dltrace itself.
    Regions recorded by the Python bindings are named ``module:function``; a region is left out
    when its file or its name is excluded."""
    paths = sysconfig.get_paths()
    files = sorted({paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"],
                    str(BOOTSTRAP.parent), str(Path(records.__file__).resolve().parent)})
    lines = [
        "# dltrace's default Score-P filter (instrument run --scorep). Replace it with",
        "# --scorep-filter FILE, or record every Python function with --scorep-filter none.",
        "SCOREP_FILE_NAMES_BEGIN",
        *(f"  EXCLUDE {p}/*" for p in files),
        "  EXCLUDE */site-packages/*",
        "  EXCLUDE */dist-packages/*",
        "  EXCLUDE <frozen *>",
        "SCOREP_FILE_NAMES_END",
        "SCOREP_REGION_NAMES_BEGIN",
        "  EXCLUDE instrument.* instrument:* traceio.* traceio:* importlib.* <frozen *",
        "  INCLUDE user:*",
        "SCOREP_REGION_NAMES_END",
        "",
    ]
    return "\n".join(lines)


def write_filter(run_dir: Path, choice: str | None) -> Path | None:
    """Put the run's filter at ``run_dir/scorep.filter``: ours (``None``), the user's file, or
    none at all (``"none"``). Returns its path, or None without a filter."""
    if choice == "none":
        return None
    target = Path(run_dir) / FILTER_FILE
    check_filter(choice)
    if choice is None:
        target.write_text(default_filter())
    else:
        shutil.copyfile(choice, target)
    return target


def check_filter(choice: str | None) -> None:
    """Fail before anything starts when a user filter file does not exist."""
    if choice not in (None, "none") and not Path(choice).is_file():
        raise UsageError(f"--scorep-filter: no such file: {choice}")


# -- the rank's side ----------------------------------------------------------------------------
def experiment_dir(env: dict[str, str]) -> Path:
    """Where this rank's Score-P writes: the run's experiment (MPI) or the rank's own."""
    run_dir = Path(env["DLTRACE_RUN_DIR"])
    if env.get(MPP_VAR) == "mpi":
        return run_dir / EXPERIMENT_DIR
    rank, _, _ = rank_from_env(env)
    return run_dir / EXPERIMENT_DIR / f"rank-{rank:05d}"


def main(argv: list[str] | None = None) -> None:
    """``python -m instrument.scorep [SCORE-P OPTIONS] -- SCRIPT ARGS``: the per-rank entry."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m instrument.scorep [SCORE-P OPTIONS] -- SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    cut = argv.index("--")
    opts, script, args = argv[:cut], argv[cut + 1], argv[cut + 2:]
    env = dict(os.environ)
    try:
        check_available(is_mpi(opts))
        if "DLTRACE_RUN_DIR" not in env:
            raise RankEnvError("DLTRACE_RUN_DIR is not set; start ranks with `instrument run --scorep`.")
        where = experiment_dir(env)
    except (UsageError, RankEnvError) as e:
        print(f"dltrace: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    where.parent.mkdir(parents=True, exist_ok=True)
    os.environ["SCOREP_EXPERIMENT_DIRECTORY"] = str(where)
    command = bindings_command(opts, script, args)
    os.execv(command[0], command)


def prepare_rank(env: dict[str, str]) -> None:
    """Inside the rank, before the recorder starts: an MPI experiment needs MPI initialized, so
    Score-P sees MPI_Init even when the script itself never imports mpi4py."""
    if env.get(MPP_VAR) == "mpi":
        import mpi4py.MPI  # noqa: F401 -- imported for its side effect, MPI_Init


# -- the recorder -----------------------------------------------------------------------------
class UserApi(Protocol):
    """The part of ``scorep.user`` we call (a recorder object stands in for it in tests)."""

    def region_begin(self, name: str, file_name: str | None = None, line_number: int | None = None) -> None: ...

    def region_end(self, name: str) -> None: ...


_THREAD_KINDS = ("main", "thread")


class ScorepRecorder(Tracer):
    """Emits regions on Python threads as Score-P user regions (``user:<name>``, names as the
    built-in tracer's), and keeps the rest in the side file the merge joins to Score-P's trace.

    Score-P stamps each user region with its own clock when it is called, so times passed
    in by hooks (a few microseconds old) are not used for regions; anything recorded after
    the fact (asynchronous collectives, imported timelines, our side file's own flushes) goes
    to the side file, on the locations the built-in tracer would use.
    """

    def __init__(self, *args: Any, user_api: UserApi | None = None, **kwargs: Any):
        if user_api is None:
            import scorep.user  # the bindings (absolute import), not this module

            user_api = scorep.user
        self._api: UserApi = user_api
        super().__init__(*args, **kwargs)
        self.meta["backend"] = "scorep"
        self.meta["scorep_sync"] = []

    def _on_thread(self, loc: int) -> bool:
        return self.loc_kinds[loc] in _THREAD_KINDS

    def _emit_enter(self, loc: int, rid: int, t: int) -> None:
        if self._on_thread(loc):
            self._api.region_begin(self.region_defs[rid]["name"], REGION_FILE, 0)
        else:
            super()._emit_enter(loc, rid, t)

    def _emit_leave(self, loc: int, rid: int, t: int) -> None:
        if self._on_thread(loc):
            self._api.region_end(self.region_defs[rid]["name"])
        else:
            super()._emit_leave(loc, rid, t)

    def _emit_coll_end(
        self, loc: int, t: int, comm: int, op: records.Op, root: int, sent: int, recv: int
    ) -> None:
        # The region performing the collective is open on this thread (Recorder.collective_end
        # is called before its leave); the merge pairs the record with that region's instance.
        stack = self._stacks[loc]
        self._append(t, Kind.COLL_END, region=stack[-1] if stack else 0, loc=loc, comm=comm,
                     op=op, root=root, bytes_sent=sent, bytes_recv=recv)

    def sync_clock(self, label: str) -> Any:
        """Measure the offset to the reference clock inside a ``dltrace.clock_sync`` user region,
        and note the local times of its enter and leave: the merge pairs them with Score-P's
        timestamps of the same events to map Score-P's clock onto ours."""
        name = records.CLOCK_SYNC
        t0 = self.now()
        self._api.region_begin(name, REGION_FILE, 0)
        t1 = self.now()
        sample = measure_offset(self.clock_server, self.clock) if self.clock_server else None
        t2 = self.now()
        self._api.region_end(name)
        t3 = self.now()
        self.meta["scorep_sync"].append({"label": label, "enter_ns": (t0 + t1) // 2,
                                         "leave_ns": (t2 + t3) // 2})
        if sample is not None:
            self.meta["clock_samples"].append({"label": label, **sample.as_dict()})
        self._defs_changed = True
        return sample

    def finalize(self, status: str, detail: str | None = None) -> None:
        """Close what is still open on this thread (Score-P needs balanced regions), then
        finish as the built-in tracer does."""
        if self.meta["status"] == "running":
            self.end_steps()
            self.unwind(0)
        super().finalize(status, detail)
