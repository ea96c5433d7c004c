"""Real Score-P archives: exact, hand-verifiable facts from tests/fixtures/scorep/README.md."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyze


@pytest.fixture
def open_fixture(scorep_fixtures: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    def _open(name: str) -> duckdb.DuckDBPyConnection:
        return analyze.open(scorep_fixtures / name, db=tmp_path / f"{name}.duckdb")
    return _open


def one(db: duckdb.DuckDBPyConnection, sql: str):  # type: ignore[no-untyped-def]
    return db.execute(sql).fetchone()


def test_pingpong_counts(open_fixture) -> None:  # type: ignore[no-untyped-def]
    db = open_fixture("pipit-pingpong")
    # README: 120 events (Enter 42, Leave 42, MpiSend 16, MpiRecv 16, ProgramBegin 2, ProgramEnd 2)
    assert one(db, "select events, ranks from runs") == (120, 2)
    assert one(db, "select count(*) from intervals") == (42,)  # one per Enter/Leave pair
    assert one(db, "select count(*) from intervals where truncated") == (0,)
    # 8 MPI_Send + 8 MPI_Recv per rank, 4,177,920 bytes sent per rank
    rows = db.execute("""select rank, direction, count(*), sum(bytes) from p2p
                         group by all order by all""").fetchall()
    assert rows == [(0, "recv", 8, 4_177_920), (0, "send", 8, 4_177_920),
                    (1, "recv", 8, 4_177_920), (1, "send", 8, 4_177_920)]
    # every message found its partner
    assert one(db, "select count(*) from p2p where partner_enter_ns is null") == (0,)
    # trace length 0.1996 s
    assert one(db, "select round(duration_ns / 1e9, 4) from runs") == (0.1996,)
    assert one(db, "select count(*) from collectives") == (0,)


def test_bcast4_one_bcast_and_mpi_init_is_not_communication(open_fixture) -> None:  # type: ignore[no-untyped-def]
    db = open_fixture("sstelements-bcast4")
    assert one(db, "select ranks from runs") == (4,)
    # one MPI_Bcast per rank, root 0, 4096 bytes received per rank; the CREATE_HANDLE /
    # DESTROY_HANDLE records of MPI_Init and MPI_Finalize are not collectives
    rows = db.execute("select rank, op, root, bytes, ranks_matched from collectives order by rank").fetchall()
    assert rows == [(r, "bcast", 0, 4096, 4) for r in range(4)]
    # communication phases are exactly the MPI_Bcast regions: MPI_Init (about 1.108 s of the
    # 1.117 s trace) counts as runtime setup (phase other), not communication
    comm = db.execute("""select rank, sum(duration_ns) from phases
                         where phase in ('allreduce', 'other_comm', 'idle') group by rank order by rank""").fetchall()
    bcast = db.execute("""select rank, sum(duration_ns) from intervals i join regions r using (region_id)
                          where r.name = 'MPI_Bcast' group by rank order by rank""").fetchall()
    assert comm == bcast
    init = one(db, """select min(duration_ns) from intervals i join regions r using (region_id)
                      where r.name = 'MPI_Init'""")[0]
    assert init > 1.1e9
    assert one(db, "select category from regions where name = 'MPI_Init'") == ("runtime",)
    # late root: non-roots entered before rank 0 and wait for it
    assert one(db, "select count(*) from collectives where rank > 0 and wait_ns > 0") == (3,)
    assert one(db, "select wait_ns from collectives where rank = 0") == (0,)


def test_cuda_case_allreduces_and_non_cpu_locations(open_fixture) -> None:  # type: ignore[no-untyped-def]
    db = open_fixture("casita-2_cuda_simple")
    # README: MPI_Allreduce 10, MPI_Sendrecv 10, MPI_Barrier 2 per rank
    rows = db.execute("select rank, op, count(*) from collectives group by all order by all").fetchall()
    assert rows == [(0, "allreduce", 10), (0, "barrier", 2), (1, "allreduce", 10), (1, "barrier", 2)]
    sendrecv = db.execute("""select rank, count(*) from intervals i join regions r using (region_id)
                             where r.name = 'MPI_Sendrecv' group by rank order by rank""").fetchall()
    assert sendrecv == [(0, 10), (1, 10)]
    # 2 ranks x (master thread, OpenMP thread, CUDA stream); one main thread per rank
    kinds = db.execute("select rank, kind, is_main from locations order by rank, thread").fetchall()
    assert kinds == [(0, "cpu_thread", True), (0, "cpu_thread", False), (0, "accelerator_stream", False),
                     (1, "cpu_thread", True), (1, "cpu_thread", False), (1, "accelerator_stream", False)]
    # rank-level numbers come from the main thread: one whole-run step per rank, fully split
    assert db.execute("""select count(*) from steps s join phases p using (rank, step)
                         group by s.rank, s.duration_ns having sum(p.duration_ns) <> s.duration_ns""").fetchall() == []
    assert one(db, "select sum(duration_ns) > 0 from phases where phase = 'allreduce'") == (True,)


def test_step_region_option_splits_steps(open_fixture, scorep_fixtures: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    db = analyze.open(scorep_fixtures / "pipit-pingpong", db=tmp_path / "s.duckdb", step_region="MPI_Send")
    # 8 sends per rank: each becomes a step
    assert db.execute("select rank, count(*), min(source) from steps group by rank order by rank").fetchall() == [
        (0, 8, "region:MPI_Send"), (1, 8, "region:MPI_Send")]
