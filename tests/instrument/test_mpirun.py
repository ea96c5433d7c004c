"""`instrument run --launcher mpirun` with the built-in tracer, and the mpi4py hooks.

Needs Open MPI and mpi4py, which `make setup` installs (Debian's openmpi-bin, the `mpi`
extra). Open MPI refuses to run as root unless told otherwise: as root (containers, CI) these
tests set OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, as docs/launchers.md
tells users to.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import analyze
from tests.conftest import Run, instrument_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (make setup installs openmpi-bin)"),
]
pytest.importorskip("mpi4py", reason="mpi4py is installed by make setup (the mpi extra)")

SCRIPTS = Path(__file__).parent / "scripts"


def mpirun(out: Path, name: str, *args: str) -> Run:
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    extra = ["--launcher-args=--oversubscribe"] if (os.cpu_count() or 1) < 2 else []
    run = instrument_run(out, "-np", "2", "--launcher", "mpirun", *extra, *args, name=name,
                         env=env, timeout=300)
    assert run.proc.returncode == 0, run.output
    return run


@pytest.fixture(scope="module")
def example(runs_dir: Path) -> Run:
    return mpirun(runs_dir, "mpi-example", "runs/mpi_allreduce.py", "--steps", "4", "--size", "4096",
                  "--straggle", "0.1")


def test_example_run(example: Run) -> None:
    info = example.info
    assert info["status"] == "ok" and info["complete"] is True
    assert info["launcher"] == "mpirun" and info["framework"] == "mpi4py"
    assert [r["steps"] for r in info["rank_info"]] == [4, 4]
    assert "rank 1 done: 4 steps, 2 ranks" in example.output
    assert "trace written:" in example.proc.stdout and "(2 ranks, 4 steps," in example.proc.stdout
    db = analyze.open(example.run_dir)
    rows = db.sql("SELECT rank, r.name, op, count(*), sum(bytes_sent), min(ranks_matched) "
                  "FROM collectives c JOIN regions r USING (region_id) GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [  # per step one Allreduce of 4096 float64 and one pickled allreduce; a Barrier first
        (rank, name, op, n, b, 2) for rank in (0, 1) for name, op, n, b in (
            ("mpi4py.Comm.Allreduce", "allreduce", 4, 4 * 4096 * 8), ("mpi4py.Comm.Barrier", "barrier", 1, 0),
            ("mpi4py.Comm.allreduce", "allreduce", 4, 0))]
    # rank 1 takes 100 ms longer per step (--straggle), so rank 0 waits for it in the Allreduce
    # (half of that is asserted: the machine may be busy with other work)
    idle = dict(db.sql("SELECT rank, sum(duration_ns) FROM phases WHERE phase = 'idle' GROUP BY rank").fetchall())
    assert idle[0] > 4 * 50 * 1_000_000 and idle[0] > 2 * idle[1]


def test_mpi4py_hooks_ops_bytes_roots_and_derived_communicators(runs_dir: Path) -> None:
    run = mpirun(runs_dir, "mpi-ops", str(SCRIPTS / "mpi_ops.py"))
    assert "rank 0 ok" in run.output and "rank 1 ok" in run.output
    db = analyze.open(run.run_dir)
    rows = db.sql("""
        SELECT r.name, op, root, bytes_sent, bytes_recv, m.name AS comm, count(*) AS n
        FROM collectives c JOIN regions r USING (region_id) JOIN communicators m USING (comm_id)
        WHERE rank = 0 GROUP BY ALL ORDER BY ALL""").fetchall()
    assert rows == [
        ("mpi4py.Comm.Allgather", "allgather", None, 24, 48, "MPI_COMM_WORLD", 2),
        ("mpi4py.Comm.Allreduce", "allreduce", None, 40, 40, "reversed", 2),
        ("mpi4py.Comm.Barrier", "barrier", None, 0, 0, "MPI_COMM_WORLD", 2),
        ("mpi4py.Comm.Bcast", "bcast", 1, 800, 800, "MPI_COMM_WORLD", 2),
        ("mpi4py.Comm.Reduce", "reduce", 0, 16, 16, "MPI_COMM_WORLD", 2),  # IN_PLACE: the receive buffer
        ("mpi4py.Comm.bcast", "bcast", 0, 0, 0, "MPI_COMM_WORLD", 2),  # pickled: size unknown
    ]
    assert db.sql("SELECT rank, count(*) FROM steps GROUP BY rank ORDER BY rank").fetchall() == [(0, 2), (1, 2)]
