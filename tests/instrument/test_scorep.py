"""The Score-P backend: options, environment and filter; the error where Score-P is missing;
markers as Score-P user regions; and a whole `instrument run --scorep` against a stand-in for
Score-P's Python bindings (tests/instrument/fake_scorep: Score-P itself cannot be installed here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

import analyze
from instrument.errors import UsageError
from instrument.launch import job
from instrument.scorep import backend as scorep
from instrument.tracer import recorder
from instrument.tracer.markers import region
from instrument.tracer.spill import read_rank
from tests.conftest import ROOT, Run, instrument_run
from traceio import records
from traceio.records import Kind, Op, Role

FAKE = Path(__file__).parent / "fake_scorep"


# -- options, environment, filter --------------------------------------------------------------
def test_mpi_launchers_form_one_experiment_others_one_per_rank() -> None:
    assert scorep.options("mpirun", []) == ["--mpp=mpi"]
    for launcher in ("local", "torchrun", "horovodrun", "srun"):
        assert scorep.options(launcher, []) == ["--mpp=none"]
    assert scorep.options("srun", ["--mpp=mpi", "--verbose"]) == ["--mpp=mpi", "--verbose"]
    assert scorep.is_mpi(["--mpi"]) and not scorep.is_mpi(["--mpp=none"])


def test_environment_turns_tracing_on_inside_the_run_directory(tmp_path: Path) -> None:
    env = scorep.environment(tmp_path, ["--mpp=mpi"], tmp_path / "scorep.filter", env={})
    assert env == {
        "SCOREP_ENABLE_TRACING": "true",
        "SCOREP_EXPERIMENT_DIRECTORY": str(tmp_path / "scorep"),
        "SCOREP_TOTAL_MEMORY": "64M",
        "DLTRACE_SCOREP_MPP": "mpi",
        "SCOREP_FILTERING_FILE": str(tmp_path / "scorep.filter"),
    }
    mine = scorep.environment(tmp_path, ["--mpp=none"], None, env={"SCOREP_TOTAL_MEMORY": "1G"})
    assert mine["SCOREP_TOTAL_MEMORY"] == "1G" and "SCOREP_FILTERING_FILE" not in mine
    assert mine["DLTRACE_SCOREP_MPP"] == "none"


def test_default_filter_drops_library_internals_and_keeps_markers(tmp_path: Path) -> None:
    path = scorep.write_filter(tmp_path, None)
    assert path == tmp_path / "scorep.filter"
    lines = [line.strip() for line in path.read_text().splitlines()]
    begin, end = lines.index("SCOREP_FILE_NAMES_BEGIN"), lines.index("SCOREP_FILE_NAMES_END")
    files = lines[begin + 1:end]
    assert f"EXCLUDE {sysconfig.get_paths()['stdlib']}/*" in files
    assert f"EXCLUDE {sysconfig.get_paths()['purelib']}/*" in files
    assert f"EXCLUDE {Path(scorep.__file__).resolve().parents[1]}/*" in files  # dltrace itself
    assert f"EXCLUDE {Path(records.__file__).resolve().parent}/*" in files
    assert "EXCLUDE */site-packages/*" in files
    assert not any(scorep.REGION_FILE in f for f in files)  # our user regions' file survives
    names = lines[lines.index("SCOREP_REGION_NAMES_BEGIN") + 1:lines.index("SCOREP_REGION_NAMES_END")]
    assert names[-1] == "INCLUDE user:*"  # last rule wins: markers are never filtered by name


def test_user_filter_or_none(tmp_path: Path) -> None:
    mine = tmp_path / "my.filter"
    mine.write_text("SCOREP_REGION_NAMES_BEGIN\n  EXCLUDE *\nSCOREP_REGION_NAMES_END\n")
    run = tmp_path / "run"
    run.mkdir()
    assert scorep.write_filter(run, str(mine)).read_text() == mine.read_text()  # type: ignore[union-attr]
    assert scorep.write_filter(run, "none") is None
    with pytest.raises(UsageError, match="--scorep-filter: no such file: .*nope"):
        scorep.write_filter(run, str(tmp_path / "nope"))


# -- Score-P missing ---------------------------------------------------------------------------
def test_missing_score_p_names_what_and_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(scorep.importlib.util, "find_spec", lambda name: None)
    assert scorep.missing(mpi=True) == [
        "scorep-config is not on PATH",
        f"the Score-P Python bindings (module scorep) are not installed in {sys.prefix}",
        "mpi4py (needed for --mpp=mpi) is not installed",
    ]
    with pytest.raises(UsageError) as e:
        scorep.check_available()
    text = str(e.value)
    for part in ("scorep-config is not on PATH", "module load scorep", "spack install scorep",
                 "from source", "pip install scorep", "built-in tracer"):
        assert part in text


def test_missing_score_p_starts_no_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(scorep, "missing", lambda mpi=False: ["scorep-config is not on PATH"])

    def no_process(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(job.subprocess, "Popen", no_process)
    for launcher in ("local", "mpirun", "srun", "torchrun"):
        monkeypatch.setattr(job, "check_launcher", lambda c: None)
        config = job.LaunchConfig(script=str(ROOT / "runs" / "mpi_allreduce.py"), nprocs=2,
                                     out=tmp_path / "traces", tracer="scorep", launcher=launcher)
        with pytest.raises(UsageError, match="Score-P is not available"):
            job.run(config)
    assert not (tmp_path / "traces").exists()  # not even a run directory


def test_missing_score_p_from_the_command_line(tmp_path: Path) -> None:
    """What a user sees: one sentence on stderr, exit status 2, no traceback, no run."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "instrument.cli", "run", "--scorep", "-np", "2", "--out",
         str(tmp_path), "runs/mpi_allreduce.py"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("instrument: --scorep: Score-P is not available (")
    assert "scorep-config is not on PATH" in lines[0] and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_rank_entry_on_a_node_without_score_p(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/usr/bin:/bin", DLTRACE_RUN_DIR=str(tmp_path), RANK="0", WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "-m", "instrument.scorep", "--mpp=none", "--", "x.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("dltrace: --scorep: Score-P is not available (scorep-config")
    assert not (tmp_path / "scorep").exists()


# -- markers as Score-P user regions -------------------------------------------------------------
class UserApi:
    """Stands in for ``scorep.user``: records each call with the calling thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def region_begin(self, name: str, file_name: str | None = None, line_number: int | None = None) -> None:
        assert (file_name, line_number) == (scorep.REGION_FILE, 0)  # no frame inspection
        self.calls.append(("begin", name, threading.current_thread().name))

    def region_end(self, name: str) -> None:
        self.calls.append(("end", name, threading.current_thread().name))


def nesting(calls: list[tuple[str, str, str]]) -> list[str]:
    """Calls as indented names; asserts that every end closes the innermost open region."""
    out, stack = [], []
    for kind, name, _thread in calls:
        if kind == "begin":
            out.append("  " * len(stack) + name)
            stack.append(name)
        else:
            assert stack and stack.pop() == name, (name, stack)
    assert not stack
    return out


@pytest.fixture
def backend(tmp_path: Path):  # type: ignore[no-untyped-def]
    api = UserApi()
    rec = scorep.ScorepRecorder(0, 1, tmp_path, user_api=api, flush_interval_s=None)
    recorder.install(rec)
    yield rec, api
    recorder.install(None)


def test_markers_become_user_regions_with_our_names_and_nesting(backend, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rec, api = backend
    fwd, opt = rec.region_id(records.FORWARD), rec.region_id(records.OPTIMIZER)
    coll = rec.region_id("torch.distributed.all_reduce", Role.COLL_ALL2ALL)
    world = rec.comm_id("WORLD", (0,))
    rec.sync_clock("start")
    for _ in range(2):
        with region("data_aug"):
            pass
        rec.enter(fwd)
        rec.leave(fwd)
        rec.enter(coll)
        rec.collective_end(rec.now(), world, Op.ALLREDUCE, -1, 4096, 4096)
        rec.leave(coll)
        rec.enter(opt)
        rec.leave(opt)
        rec.optimizer_done()
    rec.finalize("ok")
    assert nesting(api.calls) == [
        "dltrace.clock_sync",
        *["dltrace.step", "  data_aug", "  dltrace.forward", "  torch.distributed.all_reduce",
          "  dltrace.optimizer"] * 2,
        "dltrace.clock_sync",
    ]
    assert {thread for _, _, thread in api.calls} == {"MainThread"}
    side = read_rank(tmp_path / "ranks", 0)
    # The side file holds what user regions cannot: the collectives' details, and clock pairs.
    kinds = side.meta["thread_kinds"]
    on_threads = [r for r in side.records if kinds[r["loc"]] in ("main", "thread")]
    assert [(int(r["kind"]), int(r["region"]), int(r["bytes_sent"])) for r in on_threads] == [
        (Kind.COLL_END, coll, 4096)] * 2
    # what is not on a thread: the side file's own flushes, on the location the built-in tracer uses
    assert {side.meta["threads"][r["loc"]] for r in side.records} - {"main thread"} <= {"dltrace flushes"}
    assert side.meta["backend"] == "scorep" and side.meta["status"] == "ok"
    assert [s["label"] for s in side.meta["scorep_sync"]] == ["start", "end"]
    assert all(s["enter_ns"] <= s["leave_ns"] for s in side.meta["scorep_sync"])


def test_asynchronous_collectives_and_other_threads(backend, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rec, api = backend
    coll = rec.region_id("torch.distributed.all_reduce", Role.COLL_ALL2ALL)
    world = rec.comm_id("WORLD", (0,))
    t0 = rec.now()
    rec.async_collective(coll, t0, t0 + 1000, world, Op.ALLREDUCE, -1, 64, 64)  # ended in the past

    def worker() -> None:
        with region("prefetch"):
            pass

    t = threading.Thread(target=worker, name="loader")
    t.start()
    t.join()
    rec.finalize("ok")
    assert ("begin", "prefetch", "loader") in api.calls and ("end", "prefetch", "loader") in api.calls
    assert not any(name == "torch.distributed.all_reduce" for _, name, _ in api.calls)
    side = read_rank(tmp_path / "ranks", 0)
    (a,) = side.records[side.records["kind"] == Kind.ASYNC_COLL]
    assert (int(a["time"]), int(a["aux"]), int(a["bytes_sent"])) == (t0, t0 + 1000, 64)


def test_open_regions_are_closed_at_the_end(backend) -> None:  # type: ignore[no-untyped-def]
    """An exception leaves regions open; Score-P needs balanced regions, so finalize closes them."""
    rec, api = backend
    fwd = rec.region_id(records.FORWARD)
    rec.enter(fwd)
    with pytest.raises(RuntimeError), region("outer"):
        raise RuntimeError("boom")
    rec.finalize("exception", "RuntimeError: boom")
    assert nesting(api.calls) == ["dltrace.step", "  dltrace.forward", "    outer", "dltrace.clock_sync"]
    assert rec.steps_discarded == 1


# -- a whole run against the stand-in ------------------------------------------------------------
def fake_env() -> dict[str, str]:
    return {"PATH": f"{FAKE / 'bin'}:{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(FAKE), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def scorep_ddp_run(runs_dir: Path) -> Run:
    from tests.conftest import DDP_STEPS

    run = instrument_run(runs_dir, "--scorep", "-np", "2", "runs/ddp_resnet.py", "--steps",
                         str(DDP_STEPS), "--batch-size", "16", name="ddp-scorep", env=fake_env())
    assert run.proc.returncode == 0, run.output
    return run


@pytest.mark.slow
def test_scorep_run_layout_and_commands(scorep_ddp_run: Run) -> None:
    run_dir = scorep_ddp_run.run_dir
    info = scorep_ddp_run.info
    assert info["tracer"] == "scorep" and info["status"] == "ok" and info["complete"] is True
    for rank in (0, 1):
        exp = run_dir / "scorep" / f"rank-{rank:05d}"  # no MPI: one experiment per rank
        argv = json.loads((exp / "argv.json").read_text())
        assert argv["options"] == ["--mpp=none"]
        assert argv["program"][0] == str(ROOT / "instrument" / "bootstrap.py")
        assert argv["program"][1:] == ["runs/ddp_resnet.py", "--steps", "4", "--batch-size", "16"]
        assert argv["env"]["SCOREP_ENABLE_TRACING"] == "true"
        assert argv["env"]["SCOREP_EXPERIMENT_DIRECTORY"] == str(exp)
        assert argv["env"]["SCOREP_FILTERING_FILE"] == str(run_dir / "scorep.filter")
        calls = json.loads((exp / "calls.json").read_text())
        main = [(kind, name) for on_main, kind, name in calls if on_main]
        steps = [name for kind, name in main if kind == "begin" and name == "user:dltrace.step"]
        assert len(steps) == 4
        assert nesting([(k, n, "") for k, n in main])[:3] == [
            "user:dltrace.clock_sync", "user:dltrace.step", "  user:dltrace.dataloader"]
    assert "trace written:" in scorep_ddp_run.proc.stdout and "(2 ranks, 4 steps," in scorep_ddp_run.proc.stdout


@pytest.mark.slow
def test_same_phase_tables_as_the_builtin_tracer(scorep_ddp_run: Run, ddp_run: Run) -> None:
    """Same names, steps, collectives and bytes from both backends (times differ run to run)."""
    ours, theirs = analyze.open(ddp_run.run_dir), analyze.open(scorep_ddp_run.run_dir)
    regions = "SELECT DISTINCT name, role FROM regions JOIN intervals USING (region_id) WHERE name <> 'dltrace.flush' ORDER BY 1"
    assert ours.sql(regions).fetchall() == theirs.sql(regions).fetchall()
    steps = "SELECT rank, count(*) FROM steps GROUP BY rank ORDER BY rank"
    assert theirs.sql(steps).fetchall() == ours.sql(steps).fetchall() == [(0, 4), (1, 4)]
    colls = ("SELECT rank, op, is_async, count(*), sum(bytes_sent), min(ranks_matched) "
             "FROM collectives GROUP BY ALL ORDER BY ALL")
    assert theirs.sql(colls).fetchall() == ours.sql(colls).fetchall()
    computed = ("SELECT rank, step FROM phases WHERE phase = 'compute' AND duration_ns > 0 "
                "ORDER BY ALL")
    assert theirs.sql(computed).fetchall() == ours.sql(computed).fetchall()
    proc = subprocess.run([sys.executable, "-m", "analyze.cli", "phases", str(scorep_ddp_run.run_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split()[:3] == ["rank", "steps", "step_ms"]
