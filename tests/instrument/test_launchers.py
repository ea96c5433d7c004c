"""Command construction for every launcher and tracer: the exact argument lists, built from
lists (no shell string), and the checks that run before anything starts."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from instrument import cli
from instrument.errors import UsageError
from instrument.launch import job
from instrument.launch.job import EXPORTED, LaunchConfig, launcher_command, rank_command

PY = sys.executable
# horovodrun by full path when not on PATH (it sits beside the venv's python)
HVD = shutil.which("horovodrun") or str(Path(PY).with_name("horovodrun"))
BOOT = [PY, "-m", "instrument.bootstrap", "train.py", "--steps", "3"]
NONE = [PY, "train.py", "--steps", "3"]


def scorep_rank(mpp: str, *extra: str) -> list[str]:
    return [PY, "-m", "instrument.scorep", f"--mpp={mpp}", *extra, "--", "train.py", "--steps", "3"]


def config(launcher: str, tracer: str = "builtin", **kw) -> LaunchConfig:  # type: ignore[no-untyped-def]
    kw.setdefault("args", ["--steps", "3"])
    return LaunchConfig(script="train.py", nprocs=4, launcher=launcher, tracer=tracer, **kw)


def exports(*extra: str) -> list[str]:
    return [a for v in (*EXPORTED, *extra) for a in ("-x", v)]


@pytest.mark.parametrize(("tracer", "inner"), [
    ("builtin", BOOT), ("none", NONE), ("scorep", scorep_rank("none")),
])
def test_rank_command_per_tracer(tracer: str, inner: list[str]) -> None:
    assert rank_command(config("local", tracer)) == inner
    assert launcher_command(config("local", tracer), 29500) is None  # we start the ranks


# The inner command of every external launcher, per tracer. mpirun is an MPI launch, so the
# Score-P ranks form one experiment (--mpp=mpi); the others are not (--mpp=none).
INNER = {
    ("builtin", "torchrun"): BOOT, ("builtin", "horovodrun"): BOOT,
    ("builtin", "mpirun"): BOOT, ("builtin", "srun"): BOOT,
    ("none", "torchrun"): NONE, ("none", "horovodrun"): NONE,
    ("none", "mpirun"): NONE, ("none", "srun"): NONE,
    ("scorep", "torchrun"): scorep_rank("none"), ("scorep", "horovodrun"): scorep_rank("none"),
    ("scorep", "mpirun"): scorep_rank("mpi"), ("scorep", "srun"): scorep_rank("none"),
}


@pytest.mark.parametrize(("tracer", "launcher"), sorted(INNER))
def test_single_node_command(tracer: str, launcher: str) -> None:
    inner = INNER[(tracer, launcher)]
    expected = {
        "torchrun": [PY, "-m", "torch.distributed.run", "--nproc-per-node", "4",
                     "--master-addr", "127.0.0.1", "--master-port", "29500", *inner[1:]],
        "horovodrun": [HVD, "-np", "4", "-H", "localhost:4", "--gloo", *inner],
        "mpirun": ["mpirun", "-np", "4", *exports(), *inner],
        "srun": ["srun", "--ntasks=4", "--export=ALL", *inner],
    }[launcher]
    assert launcher_command(config(launcher, tracer), 29500) == expected


@pytest.mark.parametrize("tracer", ["builtin", "scorep"])
def test_multi_node_launcher_args_replace_the_single_node_defaults(tracer: str) -> None:
    inner = INNER[(tracer, "srun")]
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node1:29400"]
    assert launcher_command(config("torchrun", tracer, launcher_args=args), 1) == [
        PY, "-m", "torch.distributed.run", "--nproc-per-node", "4", *args, *inner[1:]]
    assert launcher_command(config("horovodrun", tracer, launcher_args=["-H", "n1:2,n2:2"]), 1) == [
        HVD, "-np", "4", "-H", "n1:2,n2:2", "--gloo", *inner]
    assert launcher_command(config("srun", tracer, launcher_args=["--nodes=2"]), 1) == [
        "srun", "--ntasks=4", "--export=ALL", "--nodes=2", *inner]
    mpi_inner = INNER[(tracer, "mpirun")]
    assert launcher_command(config("mpirun", tracer, launcher_args=["--hostfile", "hosts"]), 1) == [
        "mpirun", "-np", "4", *exports(), "--hostfile", "hosts", *mpi_inner]


def test_mpirun_exports_the_run_environment_and_only_variables_that_are_set() -> None:
    """Open MPI passes a rank only what -x names (and warns about unset names)."""
    c = config("mpirun", "scorep", env={"SCOREP_ENABLE_TRACING": "true", "DLTRACE_SCOREP_MPP": "mpi"})
    env = {"DLTRACE_RUN_DIR": "/r", "DLTRACE_TRACER": "scorep", "PYTHONUNBUFFERED": "1",
           "SCOREP_ENABLE_TRACING": "true", "DLTRACE_SCOREP_MPP": "mpi"}
    assert launcher_command(c, 1, env) == [
        "mpirun", "-np", "4",
        "-x", "DLTRACE_RUN_DIR", "-x", "DLTRACE_TRACER", "-x", "PYTHONUNBUFFERED",
        "-x", "DLTRACE_SCOREP_MPP", "-x", "SCOREP_ENABLE_TRACING", *scorep_rank("mpi")]


def test_scorep_args_pass_through_and_a_users_mpp_wins() -> None:
    c = config("srun", "scorep", scorep_args=["--mpp=mpi", "--instrumenter-type=cTrace"])
    assert rank_command(c) == [PY, "-m", "instrument.scorep", "--mpp=mpi",
                               "--instrumenter-type=cTrace", "--", "train.py", "--steps", "3"]
    c = config("mpirun", "scorep", scorep_args=["--thread=pthread"])
    assert rank_command(c) == scorep_rank("mpi", "--thread=pthread")


def test_cli_builds_the_config_from_quoted_argument_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[LaunchConfig] = []

    def fake_run(c: LaunchConfig) -> job.LaunchResult:
        seen.append(c)
        return job.LaunchResult(Path("."), 0, {}, [], None, None, None, "")

    monkeypatch.setattr(job, "run", fake_run)
    assert cli.main(["run", "--scorep", "--scorep-args=--instrumenter-type=cTrace --verbose",
                     "--scorep-filter", "none", "-np", "2", "--launcher", "srun",
                     "--launcher-args=--nodes=2 --cpus-per-task='4'", "train.py", "--lr", "0.1"]) == 0
    c = seen[-1]
    assert (c.tracer, c.launcher, c.nprocs) == ("scorep", "srun", 2)
    assert c.scorep_args == ["--instrumenter-type=cTrace", "--verbose"]
    assert c.launcher_args == ["--nodes=2", "--cpus-per-task=4"]
    assert (c.scorep_filter, c.script, c.args) == ("none", "train.py", ["--lr", "0.1"])
    assert cli.main(["run", "train.py"]) == 0
    assert (seen[-1].tracer, seen[-1].launcher, seen[-1].launcher_args) == ("builtin", "local", [])


def test_missing_launcher_fails_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no launcher here
    for launcher, hint in (("srun", "Slurm"), ("mpirun", "openmpi-bin"), ("horovodrun", "make setup")):
        if Path(sys.executable).with_name(launcher).exists():
            continue  # the venv provides it (horovodrun)
        with pytest.raises(UsageError, match=f"{launcher} not found on PATH.*{hint}"):
            job.check_launcher(config(launcher))


def test_open_mpi_as_root_needs_an_explicit_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.4'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(job.os, "geteuid", lambda: 0)
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    with pytest.raises(UsageError, match="Open MPI refuses to run as root; add --launcher-args=--allow-run-as-root"):
        job.check_launcher(config("mpirun"))
    job.check_launcher(config("mpirun", launcher_args=["--allow-run-as-root"]))
    job.check_launcher(config("mpirun", env={"OMPI_ALLOW_RUN_AS_ROOT": "1",
                                                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}))
    fake.write_text("#!/bin/sh\necho 'HYDRA build details: MPICH'\n")  # MPICH does not care
    job.check_launcher(config("mpirun"))


def test_commands_are_argument_lists_not_shell_strings() -> None:
    for tracer, launcher in INNER:
        cmd = launcher_command(config(launcher, tracer, args=["a b", "$HOME;rm"]), 1)
        assert cmd is not None and cmd[-2:] == ["a b", "$HOME;rm"]  # not split, not expanded
        assert all(isinstance(a, str) for a in cmd)


def test_ranks_started_by_mpirun_or_srun_get_torchs_env_variables() -> None:
    """DDP's env:// rendezvous reads RANK and WORLD_SIZE, which only torchrun and we set."""
    from instrument.launch.rank_env import torch_env

    assert torch_env({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert torch_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == {"RANK": "5", "WORLD_SIZE": "8"}
    assert torch_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}) == {}
