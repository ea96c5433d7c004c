"""Traces of frameworks we cannot run here, written the way Score-P records them: regions
named like each library's functions (role FUNCTION, no collective records, as compiler
instrumentation, the Python bindings or the CUDA adapter's NVTX support write them). Each
test states the phase split and the matched collectives it expects, in integer ms."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

import analyze
from analyze.cli import main
from tests.literal import write_literal

MS = 1_000_000


def build(tmp_path: Path, items: list, **options: Any) -> duckdb.DuckDBPyConnection:
    write_literal(tmp_path / "run", items)
    return analyze.open(tmp_path / "run", **options)


def phases(db: duckdb.DuckDBPyConnection) -> dict[tuple[int, str], int]:
    rows = db.execute("SELECT rank, phase, sum(duration_ns) FROM phases GROUP BY ALL").fetchall()
    return {(r, p): int(ns) // MS for r, p, ns in rows if ns}


def collectives(db: duckdb.DuckDBPyConnection) -> list[tuple]:
    """rank, seq, op, region name, bytes, wait ms, transfer ms, ranks matched, source, group."""
    return db.execute("""
        SELECT c.rank, c.seq, c.op, r.name, c.bytes, c.wait_ns // 1000000, c.transfer_ns // 1000000,
               c.ranks_matched, c.source, cm.name
        FROM collectives c JOIN regions r USING (region_id) JOIN communicators cm USING (comm_id)
        ORDER BY cm.name, c.seq, c.rank""").fetchall()


# Score-P's GCC plugin / clang: demangled names with parameters (docs/research/comm-names.md)
STEP = "lbann::sgd_training_algorithm::train_mini_batch(lbann::ExecutionContext&, lbann::model&)"
LBANN_ALLREDUCE = "void lbann::lbann_comm::allreduce<float>(float*, int, El::mpi::Comm const&, El::mpi::Op)"
AL_ALLREDUCE = ("void Al::Allreduce<Al::MPIBackend, float>(float const*, float*, unsigned long, Al::ReductionOperator, "
                "Al::MPIBackend::comm_type&, Al::MPIBackend::allreduce_algo_type)")


def lbann_steps(record: bool) -> list:
    """Two steps on two ranks; rank 1 reaches the gradient allreduce 10 ms after rank 0."""
    items = []
    for rank, late in ((0, 0), (1, 10)):
        for step in range(2):
            t = step * 100
            items += [
                (rank, STEP, t * MS, (t + 100) * MS),
                (rank, "lbann::model::forward_prop(lbann::ExecutionMode)", (t + 5) * MS, (t + 40) * MS),
                (rank, "lbann::model::backward_prop()", (t + 40) * MS, (t + 60) * MS),
                (rank, LBANN_ALLREDUCE, (t + 60 + late) * MS, (t + 90) * MS),
                (rank, AL_ALLREDUCE, (t + 61 + late) * MS, (t + 89) * MS),
                (rank, "lbann::sgd::step()", (t + 90) * MS, (t + 95) * MS),
            ]
            if record:
                items.append((rank, "MPI_Allreduce", (t + 62 + late) * MS, (t + 88) * MS,
                              {"op": "allreduce", "bytes": 4096}))
    return items


def test_lbann_allreduce_by_name_is_matched_across_ranks_and_counted_once(tmp_path: Path) -> None:
    db = build(tmp_path, lbann_steps(record=False), step_region=STEP)
    # per step: rank 0 waits 10 ms for rank 1, then both transfer 20 ms; Al::Allreduce inside
    # lbann_comm::allreduce is the same operation, not a second one
    assert phases(db) == {(0, "compute"): 140, (0, "idle"): 20, (0, "allreduce"): 40,
                          (1, "compute"): 160, (1, "allreduce"): 40}
    assert collectives(db) == [
        (0, 0, "allreduce", LBANN_ALLREDUCE, None, 10, 20, 2, "name", "name-only: LBANN"),
        (1, 0, "allreduce", LBANN_ALLREDUCE, None, 0, 20, 2, "name", "name-only: LBANN"),
        (0, 1, "allreduce", LBANN_ALLREDUCE, None, 10, 20, 2, "name", "name-only: LBANN"),
        (1, 1, "allreduce", LBANN_ALLREDUCE, None, 0, 20, 2, "name", "name-only: LBANN"),
    ]


def test_an_mpi_record_inside_wins_over_the_names_around_it(tmp_path: Path) -> None:
    db = build(tmp_path, lbann_steps(record=True), step_region=STEP)
    # the same split: waiting now comes from MPI_Allreduce's record (rank 0 enters at 62,
    # rank 1 at 72), the rest of lbann_comm::allreduce is allreduce by its pattern
    assert phases(db) == {(0, "compute"): 140, (0, "idle"): 20, (0, "allreduce"): 40,
                          (1, "compute"): 160, (1, "allreduce"): 40}
    assert collectives(db) == [
        (0, 0, "allreduce", "MPI_Allreduce", 4096, 10, 16, 2, "record", "WORLD"),
        (1, 0, "allreduce", "MPI_Allreduce", 4096, 0, 16, 2, "record", "WORLD"),
        (0, 1, "allreduce", "MPI_Allreduce", 4096, 10, 16, 2, "record", "WORLD"),
        (1, 1, "allreduce", "MPI_Allreduce", 4096, 0, 16, 2, "record", "WORLD"),
    ]


def test_name_only_collectives_beside_recorded_ones(tmp_path: Path) -> None:
    items = []
    for rank in (0, 1):
        items += [(rank, "main", 0, 50 * MS),
                  (rank, "gaspi_allreduce", (1 + rank) * MS, 5 * MS),
                  (rank, "MPI_Allreduce", (10 + rank) * MS, 20 * MS, {"op": "allreduce", "bytes": 8}),
                  (rank, "gaspi_barrier", 30 * MS, (40 - rank) * MS)]
    db = build(tmp_path, items)
    # a record before or after a region is not inside it: both GPI-2 calls stay collectives
    assert [(r, s, op, src, w) for r, s, op, _, _, w, _, _, src, _ in collectives(db)] == [
        (0, 0, "allreduce", "record", 1), (1, 0, "allreduce", "record", 0),
        (0, 0, "allreduce", "name", 1), (1, 0, "allreduce", "name", 0),
        (0, 1, "barrier", "name", 0), (1, 1, "barrier", "name", 0)]


@pytest.mark.parametrize(("also_send", "wait_phase"), [(False, "allreduce"), (True, "other_comm")])
def test_lbann_wait_takes_the_operation_of_its_nonblocking_starts(
    tmp_path: Path, also_send: bool, wait_phase: str,
) -> None:
    items = []
    for rank in (0, 1):
        items += [(rank, "main", 0, 100 * MS), (rank, "lbann::model::backward_prop()", 10 * MS, 60 * MS),
                  (rank, "void lbann::lbann_comm::nb_allreduce<float>(float*, int, El::mpi::Comm const&, "
                   "Al::request&, El::mpi::Op)", 30 * MS, 31 * MS),
                  (rank, "lbann::lbann_comm::wait(Al::request&)", 60 * MS, 75 * MS),
                  (rank, "lbann::model::update_weights()", 75 * MS, 100 * MS)]
        if also_send:
            items.append((rank, "void lbann::lbann_comm::nb_send<float>(float const*, int, int, int, "
                          "Al::request&)", 40 * MS, 41 * MS))
    db = build(tmp_path, items)
    # a start is communication for its own time; the wait completes an allreduce when every
    # non-blocking start of LBANN is one
    expect = {(r, "allreduce"): 1 for r in (0, 1)}
    for r in (0, 1):
        expect[(r, wait_phase)] = expect.get((r, wait_phase), 0) + 15
        if also_send:
            expect[(r, "other_comm")] += 1
        expect[(r, "compute")] = 100 - sum(v for (k, _), v in expect.items() if k == r)
    assert phases(db) == expect
    assert collectives(db) == []  # starts are not matched: their enter says nothing about waiting
    op = db.execute("SELECT pattern_op FROM regions WHERE name LIKE 'lbann::lbann_comm::wait%'").fetchone()
    assert op == (None if also_send else "allreduce",)


def test_gpi2_allreduce_barrier_writes_and_notification_waits(tmp_path: Path) -> None:
    items = []
    for rank, late in ((0, 0), (1, 10)):
        items += [(rank, "gaspi_proc_init", 0, 10 * MS),
                  (rank, "tarantella_main_loop", 10 * MS, 50 * MS),
                  (rank, "gaspi_write_notify", 50 * MS, 52 * MS),
                  (rank, "gaspi_notify_waitsome", 52 * MS, (60 + 5 * rank) * MS),
                  (rank, "gaspi_allreduce", (70 + late) * MS, 90 * MS),
                  (rank, "gaspi_barrier", 95 * MS, 100 * MS)]
    db = build(tmp_path, items)
    # gaspi_proc_init is runtime (other); the write is a start and the notification wait
    # completes writes (other communication); gaspi_allreduce and gaspi_barrier are matched
    assert phases(db) == {(0, "other"): 10, (0, "compute"): 55, (0, "other_comm"): 15, (0, "idle"): 10,
                          (0, "allreduce"): 10,
                          (1, "other"): 10, (1, "compute"): 60, (1, "other_comm"): 20, (1, "allreduce"): 10}
    assert collectives(db) == [
        (0, 0, "allreduce", "gaspi_allreduce", None, 10, 10, 2, "name", "name-only: GPI-2"),
        (1, 0, "allreduce", "gaspi_allreduce", None, 0, 10, 2, "name", "name-only: GPI-2"),
        (0, 1, "barrier", "gaspi_barrier", None, 0, 5, 2, "name", "name-only: GPI-2"),
        (1, 1, "barrier", "gaspi_barrier", None, 0, 5, 2, "name", "name-only: GPI-2"),
    ]


def test_tarantella_python_allreduce(tmp_path: Path) -> None:
    reducer = "tarantella.collectives.TensorAllreducer.TensorAllreducer"
    items = []
    for rank, arrive in ((0, 10), (1, 30)):
        items += [(rank, "__main__:train", 0, 50 * MS),
                  (rank, f"{reducer}:allreduce", arrive * MS, 40 * MS),
                  (rank, f"{reducer}:start", arrive * MS, (arrive + 1) * MS),
                  (rank, f"{reducer}:wait_for_completion", (arrive + 1) * MS, 40 * MS)]
    db = build(tmp_path, items)
    assert phases(db) == {(0, "compute"): 20, (0, "idle"): 20, (0, "allreduce"): 10,
                          (1, "compute"): 40, (1, "allreduce"): 10}
    assert [row[:3] + row[5:8] for row in collectives(db)] == [
        (0, 0, "allreduce", 20, 10, 2), (1, 0, "allreduce", 0, 10, 2)]


def test_nccl_nvtx_ranges_are_launches_not_transfers(tmp_path: Path) -> None:
    items = []
    for rank in (0, 1):
        items += [(rank, "ncclCommInitRank", 0, 20 * MS),
                  (rank, "forward", 20 * MS, 60 * MS),
                  (rank, "ncclGroupStart", 60 * MS, 61 * MS),
                  (rank, "ncclAllReduce", (61 + rank) * MS, 63 * MS),
                  (rank, "ncclGroupEnd", 63 * MS, 65 * MS),
                  (rank, "cudaStreamSynchronize", 65 * MS, 90 * MS),
                  (rank, "optimizer", 90 * MS, 100 * MS)]
    db = build(tmp_path, items)
    # the range covers the host-side enqueue: allreduce for its own time, never idle, not
    # matched; where the host then waits for the GPU (cudaStreamSynchronize) stays compute
    assert phases(db) == {(0, "other"): 23, (0, "allreduce"): 2, (0, "compute"): 75,
                          (1, "other"): 23, (1, "allreduce"): 1, (1, "compute"): 76}
    assert collectives(db) == []


def oneccl_step(rank: int) -> list[tuple[int, str, int, int]]:
    """A 100 ms train_step() in which oneCCL starts a non-blocking allreduce (40-41 ms) and
    waits for it (60-80 ms)."""
    return [(rank, "train_step()", 0, 100 * MS),
            (rank, "ccl::v1::event ccl::v1::allreduce(void const*, void*, unsigned long, ccl::v1::datatype, "
             "ccl::v1::reduction, ccl::v1::communicator const&, ccl::v1::stream const&, "
             "ccl::v1::allreduce_attr const&, std::vector<ccl::v1::event, std::allocator<ccl::v1::event> > "
             "const&)", 40 * MS, 41 * MS),
            (rank, "ccl::v1::event::wait()", 60 * MS, 80 * MS)]


def test_oneccl_event_wait_completes_an_allreduce(tmp_path: Path) -> None:
    items = []
    for rank in (0, 1):
        items += oneccl_step(rank)
    db = build(tmp_path, items)
    assert phases(db) == {(r, p): v for r in (0, 1) for p, v in (("allreduce", 21), ("compute", 79))}
    assert db.execute("SELECT pattern_op FROM regions WHERE name = 'ccl::v1::event::wait()'").fetchone() == ("allreduce",)


def test_c10d_python_collectives_inside_decorator_wrappers(tmp_path: Path) -> None:
    ddp = "torch.nn.parallel.distributed.DistributedDataParallel"
    items = []
    for rank, late in ((0, 0), (1, 5)):
        items += [(rank, "__main__:train_step", 0, 100 * MS),
                  (rank, f"{ddp}:forward", 5 * MS, 40 * MS),
                  (rank, f"{ddp}:_sync_buffers", 5 * MS, 8 * MS),
                  (rank, f"{ddp}:_sync_module_buffers", 6 * MS, 7 * MS),
                  (rank, "torch.autograd:backward", 40 * MS, 70 * MS),
                  (rank, "torch.distributed.c10d_logger:wrapper", (70 + late) * MS, 95 * MS),
                  (rank, "torch.distributed.distributed_c10d:all_reduce", (71 + late) * MS, 94 * MS),
                  (rank, "torch.optim.sgd.SGD:step", 95 * MS, 99 * MS)]
    db = build(tmp_path, items, step_region="__main__:train_step")
    # the buffer broadcast has no root in the trace, so nobody is idle in it; the allreduce
    # waits for rank 1 (enters at 76); the logger's wrapper around it stays compute
    assert phases(db) == {(0, "compute"): 74, (0, "other_comm"): 3, (0, "idle"): 5, (0, "allreduce"): 18,
                          (1, "compute"): 79, (1, "other_comm"): 3, (1, "allreduce"): 18}
    got = [(r, s, op, name.rsplit(":", 1)[1], w, t, n) for r, s, op, name, _, w, t, n, _, _ in collectives(db)]
    assert got == [(0, 0, "bcast", "_sync_buffers", 0, 3, 2), (1, 0, "bcast", "_sync_buffers", 0, 3, 2),
                   (0, 1, "allreduce", "all_reduce", 5, 18, 2), (1, 1, "allreduce", "all_reduce", 0, 18, 2)]


def test_gloo_on_a_worker_thread_counts_where_the_main_thread_waits(tmp_path: Path) -> None:
    items = []
    for rank, issue in ((0, 40), (1, 55)):
        items += [(rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.backward", 10 * MS, 60 * MS),
                  (rank, "c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)", 50 * MS, 60 * MS),
                  (rank, "gloo::allreduce(gloo::AllreduceOptions const&)", issue * MS, 58 * MS, {"lane": True})]
    db = build(tmp_path, items)
    # rank 0's reduction (on another thread) waits 15 ms for rank 1, but 10 of them are hidden
    # by backward; inside the wait: idle until rank 1 arrives, then allreduce, then the wait's
    # own tail (other communication: no c10d start names its operation)
    assert phases(db) == {(0, "compute"): 90, (0, "idle"): 5, (0, "allreduce"): 3, (0, "other_comm"): 2,
                          (1, "compute"): 90, (1, "allreduce"): 3, (1, "other_comm"): 7}
    assert db.execute("SELECT rank, is_async, wait_ns // 1000000, source FROM collectives ORDER BY rank").fetchall() \
        == [(0, True, 15, "name"), (1, True, 0, "name")]


def test_horovod_synchronize_completes_allreduces(tmp_path: Path) -> None:
    items = []
    for rank in (0, 1):
        items += [(rank, "horovod.torch.functions:broadcast_parameters", 0, 8 * MS),
                  (rank, "horovod.torch.mpi_ops:broadcast_async_", 1 * MS, 2 * MS),
                  (rank, "horovod.torch.mpi_ops:synchronize", 2 * MS, 7 * MS),
                  (rank, "__main__:train_step", 10 * MS, 110 * MS),
                  (rank, "torch.autograd:backward", 20 * MS, 70 * MS),
                  (rank, "horovod.torch.optimizer.SGD:_allreduce_grad_async", 30 * MS, 31 * MS),
                  (rank, "horovod.torch.mpi_ops:allreduce_async_", 30 * MS + 200_000, 30 * MS + 800_000),
                  (rank, "horovod.torch.optimizer.SGD:step", 70 * MS, 105 * MS),
                  (rank, "horovod.torch.optimizer.SGD:synchronize", 70 * MS, (90 + 5 * rank) * MS),
                  (rank, "horovod.torch.mpi_ops:synchronize", 71 * MS, (89 + 5 * rank) * MS)]
    db = build(tmp_path, items, step_region="__main__:train_step")
    # the optimizer's outermost start is an allreduce (the broadcast's start is inside
    # broadcast_parameters), so its synchronize is allreduce time
    assert phases(db) == {(0, "allreduce"): 21, (0, "compute"): 79, (1, "allreduce"): 26, (1, "compute"): 74}
    ops = dict(db.execute("SELECT name, pattern_op FROM regions WHERE name LIKE '%synchronize'").fetchall())
    assert ops == {"horovod.torch.optimizer.SGD:synchronize": "allreduce", "horovod.torch.mpi_ops:synchronize": "allreduce"}
    assert [row[2:4] for row in collectives(db)] == [("bcast", "horovod.torch.functions:broadcast_parameters")] * 2


def test_analyze_patterns_lists_each_region_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_literal(tmp_path / "run", lbann_steps(record=True) + [
        (r, "mylib::allreduce_gradients(float*)", 300 * MS, 310 * MS) for r in (0, 1)])
    assert main(["patterns", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    def line(name: str) -> str:
        (found,) = [x for x in out.splitlines() if name in x]
        return found

    assert "pattern LBANN: lbann::lbann_comm::(?:allreduce|trainer_allreduce)" in line("void lbann::lbann_comm::allreduce")
    assert "(matched as lbann::lbann_comm::allreduce<float>)" in line("void lbann::lbann_comm::allreduce")
    assert "OTF2 region role coll_all2all; OTF2 collective records on 4 instances" in line("MPI_Allreduce")
    assert line("mylib::allreduce_gradients").startswith("?") and "default: compute" in line("mylib::allreduce_g")
    assert "default: compute" in line("lbann::model::forward_prop")
    assert "1 region counted as compute with a communication word" in out


def test_patterns_file_changes_the_tables_and_rebuilds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = []
    for rank, arrive in ((0, 10), (1, 30)):
        items += [(rank, "main", 0, 50 * MS), (rank, "mylib::sum_gradients(float*)", arrive * MS, 40 * MS)]
    write_literal(tmp_path / "run", items)
    run = str(tmp_path / "run")
    assert main(["phases", run]) == 0
    assert analyze.open(run).execute("SELECT count(*) FROM collectives").fetchone() == (0,)
    mine = tmp_path / "mylib.toml"
    mine.write_text('[[pattern]]\nlibrary = "mylib"\nglob = "mylib::sum_gradients"\ncategory = "allreduce"\n')
    assert main(["phases", run, "--patterns", str(mine)]) == 0  # a new signature: rebuilt
    db = analyze.open(run, patterns=mine)
    assert phases(db) == {(0, "compute"): 20, (0, "idle"): 20, (0, "allreduce"): 10,
                          (1, "compute"): 40, (1, "allreduce"): 10}
    assert db.execute("SELECT value FROM build_info WHERE key = 'patterns'").fetchone() == (str(mine),)
    mine.write_text("[[pattern]]\nglob = 'mylib::*'\ncategory = 'allreduc'\n")
    capsys.readouterr()
    assert main(["phases", run, "--patterns", str(mine)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pattern 1: category 'allreduc' is not one of" in err
