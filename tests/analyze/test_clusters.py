"""The Dask engine on clusters: the Slurm configuration docs/scale.md documents (its job
script, without submitting it), a running scheduler, ``mpirun`` with dask-mpi, and the errors
a user can cause."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import analyze
from analyze.engine import clusters
from tests.analyze.snapshot import snapshot
from tests.analyze.test_engines import literal_run
from tests.conftest import ROOT


def documented_slurm_configuration() -> dict:
    import yaml

    text = (ROOT / "docs" / "scale.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "jobqueue" in b]
    assert len(blocks) == 1
    return yaml.safe_load(blocks[0])


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "analyze.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_documented_slurm_configuration_gives_this_job_script() -> None:
    import dask

    with dask.config.set(documented_slurm_configuration()):
        cluster = clusters.slurm()
        try:
            script = cluster.job_script()
        finally:
            cluster.close()
    lines = script.splitlines()
    for directive in ("#SBATCH -J dltrace-analyze", "#SBATCH -p normal", "#SBATCH -A myproject",
                      "#SBATCH -n 1", "#SBATCH --cpus-per-task=8", "#SBATCH -t 01:00:00"):
        assert directive in lines, script
    assert any(line.startswith("#SBATCH --mem=") for line in lines), script
    assert "module load python/3.11" in lines and "source $HOME/dltrace/.venv/bin/activate" in lines
    worker = next(line for line in lines if "distributed.cli.dask_worker" in line)
    # eight single-threaded worker processes of 4 GB (3.73 GiB) each, whose scratch space is the node's
    for option in ("--nthreads 1", "--nworkers 8", "--memory-limit 3.73GiB", "--local-directory $TMPDIR"):
        assert option in worker, worker


def test_slurm_without_configuration_says_what_to_configure(tmp_path: Path) -> None:
    run = literal_run(tmp_path / "run")
    proc = cli("phases", str(run), "--engine", "dask", "--scheduler", "slurm",
               env={"DASK_CONFIG": str(tmp_path / "no-dask-config")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "needs Dask's jobqueue.slurm configuration" in proc.stderr and "docs/scale.md" in proc.stderr


def test_unreachable_scheduler_and_scheduler_without_dask_are_clear_errors(tmp_path: Path) -> None:
    run = literal_run(tmp_path / "run")
    proc = cli("phases", str(run), "--engine", "dask", "--scheduler", "tcp://127.0.0.1:9",
               env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot reach the Dask scheduler tcp://127.0.0.1:9" in proc.stderr
    proc = cli("phases", str(run), "--scheduler", "tcp://127.0.0.1:9")
    assert proc.returncode == 1 and proc.stderr.strip() == "analyze: --scheduler needs --engine dask"
    assert not (run / "trace.duckdb").exists()


def test_a_scheduler_that_is_neither_address_nor_scheduler_file_is_a_clear_error(tmp_path: Path) -> None:
    run = literal_run(tmp_path / "run")
    (tmp_path / "notes.json").write_text('{"workers": 4}')
    (tmp_path / "garbage.json").write_text("not json")
    for scheduler, said in ((str(tmp_path / "missing.json"), "no file and no address"),
                            ("node17", "no file and no address"),  # no port
                            (str(tmp_path / "notes.json"), "not a Dask scheduler file"),
                            (str(tmp_path / "garbage.json"), "not a Dask scheduler file")):
        proc = cli("phases", str(run), "--engine", "dask", "--scheduler", scheduler, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert said in proc.stderr and "tcp://host:8786" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (run / "trace.duckdb").exists()


def test_mpi_outside_mpirun_is_a_clear_error(tmp_path: Path) -> None:
    run = literal_run(tmp_path / "run")
    proc = cli("phases", str(run), "--engine", "dask", "--scheduler", "mpi")  # an MPI world of one
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs at least 3 MPI ranks" in proc.stderr


@pytest.mark.slow
def test_a_running_scheduler(tmp_path: Path) -> None:
    import distributed

    run = literal_run(tmp_path / "run")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster:
        proc = cli("phases", str(run), "--engine", "dask", "--scheduler", cluster.scheduler_address,
                   "--db", str(tmp_path / "dask.duckdb"))
    assert proc.returncode == 0, proc.stderr
    local = analyze.build(run, db=tmp_path / "local.duckdb", engine="local").db
    assert snapshot(tmp_path / "dask.duckdb") == snapshot(local)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (make setup installs openmpi-bin)")
def test_inside_mpirun_with_dask_mpi(tmp_path: Path) -> None:
    """``mpirun -np 3``: the scheduler, this command and one worker (docs/scale.md)."""
    run = literal_run(tmp_path / "run")
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    proc = cli("phases", str(run), "--engine", "dask", "--scheduler", "mpi", "--db", str(tmp_path / "mpi.duckdb"),
               env=env, prefix=("mpirun", "-np", "3", "--oversubscribe"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("database:") == 1  # only the client rank runs the command
    local = analyze.build(run, db=tmp_path / "local.duckdb", engine="local").db
    assert snapshot(tmp_path / "mpi.duckdb") == snapshot(local)
    with duckdb.connect(str(tmp_path / "mpi.duckdb"), read_only=True) as con:
        assert con.execute("select value from build_info where key = 'engine'").fetchone() == ("dask",)


@pytest.mark.slow
def test_a_local_cluster_does_not_need_the_dashboard_port(recwarn: pytest.WarningsRecorder) -> None:
    """A second analysis (or a notebook's cluster) holding port 8787 gets no warning."""
    import socket

    from analyze.engine.on_dask import DaskEngine

    with socket.socket() as holder:
        try:
            holder.bind(("", 8787))
        except OSError:
            pytest.skip("port 8787 is taken by something else here")
        holder.listen()
        engine = DaskEngine.connect(None, workers=1)
        engine.close()
    assert not [w for w in recwarn if "8787" in str(w.message)], [str(w.message) for w in recwarn]
