"""The cause tables on inputs this project did not write, and on odd shapes of input.

Every real fixture (Score-P archives of other projects, Kineto traces of public tools) and
literal traces of name-only collectives (issue 20's patterns), one rank, no step markers and
steps with nothing inside: the tables build without error and agree with ``analyze phases``
(idle attributed to causes sums to the idle phase, the exposed communication is the phases'
communication and idle, the critical path's regions add up to its length), and the views
the CLI and the report print from them work.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import analyze
from analyze.tables.causes import views
from analyze.tables.causes.device import device_paths
from tests.analyze.test_frameworks import STEP, lbann_steps, oneccl_step
from tests.kineto_literal import late_kernels, launch, nccl, step, write_rank
from tests.literal import write_literal

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCOREP = sorted(p.name for p in (FIXTURES / "scorep").iterdir() if (p / "traces.otf2").exists())
KINETO = sorted(p.name for p in (FIXTURES / "kineto").iterdir() if p.is_dir())
MS = 1_000_000


def mismatches(db: duckdb.DuckDBPyConnection) -> dict[str, list]:
    """Rows where the cause tables disagree with the phases (empty lists when they agree)."""
    return {
        "idle": db.execute("""
            SELECT p.rank, p.step, p.duration_ns, d.ns FROM phases p
            LEFT JOIN (SELECT rank, step, sum(idle_ns) AS ns FROM delays GROUP BY ALL) d USING (rank, step)
            WHERE p.phase = 'idle' AND p.duration_ns <> coalesce(d.ns, 0)""").fetchall(),
        "exposed": db.execute("""
            SELECT s.rank, s.step, o.exposed_ns, p.ns FROM steps s
            LEFT JOIN (SELECT * FROM overlap WHERE kind = 'all') o USING (rank, step)
            LEFT JOIN (SELECT rank, step, sum(duration_ns) FILTER (WHERE phase IN ('allreduce', 'other_comm', 'idle'))
                              AS ns FROM phases GROUP BY ALL) p USING (rank, step)
            WHERE o.exposed_ns IS DISTINCT FROM p.ns""").fetchall(),
        # a step of length 0 has a path of no stretches
        "path": db.execute("""
            SELECT s.step, s.duration_ns, r.ns FROM step_balance s
            LEFT JOIN (SELECT step, sum(duration_ns) AS ns FROM critical_path_regions GROUP BY step) r USING (step)
            WHERE coalesce(r.ns, 0) <> s.duration_ns""").fetchall(),
    }


def assert_views_work(db: duckdb.DuckDBPyConnection) -> None:
    """What analyze causes / overlap / critical-path and the report pages read."""
    views.delay_lines(db)
    views.overlap_summary(db)
    views.device_overlap_summary(db)
    views.critical_path_summary(db)
    views.path_contributions(db)
    views.overlap_steps(db)
    views.cause_steps(db)
    views.path_steps(db)
    views.device_path_summary(db)


@pytest.mark.parametrize("name", SCOREP)
def test_scorep_fixtures_agree_with_the_phases(name: str, tmp_path: Path) -> None:
    db = analyze.open(FIXTURES / "scorep" / name, db=tmp_path / "t.duckdb")
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert_views_work(db)


@pytest.mark.parametrize("name", KINETO)
def test_kineto_fixtures_agree_with_the_phases(name: str,
                                               kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    db = kineto_db(name)
    found = mismatches(db)
    assert found["idle"] == [] and found["exposed"] == []
    # NCCL/RCCL kernels on accelerator streams are the device's view (device_phases): without
    # host collectives (gloo's, on CPU runs) the host's overlap table counts the host's
    # communication calls (the c10d calls that enqueue the kernels) and nothing of the kernels
    host_comm = db.execute("""SELECT count(*) FROM collectives c JOIN locations l USING (location_id)
                              WHERE l.kind <> 'accelerator_stream'""").fetchall()[0][0]
    if host_comm == 0:
        (phases_comm,), = db.execute("""SELECT coalesce(sum(duration_ns), 0) FROM phases
                                        WHERE phase IN ('allreduce', 'other_comm')""").fetchall()
        (overlap_comm,), = db.execute("SELECT coalesce(sum(comm_ns), 0) FROM overlap WHERE kind = 'all'").fetchall()
        assert overlap_comm == phases_comm
    assert_views_work(db)
    # the devices' waiting: each cause rank's reasons add up to the waiting it caused
    waits, why = views.device_waits(db), views.device_wait_causes(db)
    if name in ("param_dlrm_v100_8rank", "hta_sampled_2rank"):  # the fixtures with matched NCCL kernels
        assert len(waits) > 0
    per_rank = why.groupby("cause_rank")["ms"].sum()
    assert np.allclose(per_rank.reindex(waits["cause_rank"]).to_numpy(), waits["wait_ms"].to_numpy())
    assert_device_paths_touch(db)
    # tracelens_mi300_rccl has 56 slices that only partly overlap the one before them (a
    # profiler.step call starts 11.5 us before ProfilerStep#15 ends): the overlap is counted
    # once, as the later slice's (chrome_events.own_end_ns)
    assert found["path"] == []


def assert_device_paths_touch(db: duckdb.DuckDBPyConnection) -> None:
    """The accelerators' critical path of each step: stretches that touch end to end, from the
    start of the step on the rank it begins on to the end of the step on the rank that ended it
    last, every hop after the first reached through a collective kernel's wait."""
    chain = device_paths(db)
    steps = db.execute("SELECT rank, step, start_ns, end_ns FROM steps").df().set_index(["rank", "step"])
    for n, hops in chain.groupby("step"):
        assert (hops["start_ns"].to_numpy()[1:] == hops["end_ns"].to_numpy()[:-1]).all()
        first, last = hops.iloc[0], hops.iloc[-1]
        assert first["start_ns"] == steps.loc[(first["rank"], n), "start_ns"]
        assert last["end_ns"] == steps.xs(n, level="step")["end_ns"].max()
        # going back in time, every stretch but the last (the rank that ended the step) was left through a wait
        assert pd.isna(last["via"]) and all(v.endswith(" kernel") for v in hops["via"].iloc[:-1])


def path_rows(chain: pd.DataFrame) -> list[list]:
    """The rows of a path, a NULL ``via`` as None."""
    return [[*row[:-1], None if pd.isna(row[-1]) else row[-1]] for row in chain.values.tolist()]


def test_the_devices_critical_path_goes_through_the_kernels_waits(tmp_path: Path) -> None:
    # kineto_literal.late_kernels: at step 0 rank 0's allreduce kernel waits from 40 to 60 us for
    # rank 1's (behind its gemm), and both hosts end the step at 100 us (the tie: rank 0); at
    # step 1 rank 1's kernel waits for rank 0's (its host began 10 us late), which ended it
    us = 1000
    db = analyze.open(late_kernels(tmp_path / "run", second_step_start=110))
    assert path_rows(device_paths(db)) == [
        [0, 0, 1, 0, 60 * us, 60 * us, "allreduce kernel"], [0, 1, 0, 60 * us, 100 * us, 40 * us, None],
        [1, 0, 0, 110 * us, 200 * us, 90 * us, None]]
    per_step, per_rank = views.device_path_summary(db)
    assert per_step.values.tolist() == [[0, 0.1, 2, "1 -> 0", 1, 0.06], [1, 0.09, 1, "0", 0, 0.09]]
    assert per_rank.values.tolist() == [[0, 0.13, 68.4], [1, 0.06, 31.6]]
    # the host's path cannot see it: their idle time is empty, the path stays on rank 0
    assert db.execute("SELECT DISTINCT rank FROM critical_path").fetchall() == [(0,)]
    # when the waiter ends the step last, the path starts on the rank it waited for
    write_rank(tmp_path / "late", 0, [
        step(1, 0, 100), step(2, 110, 199), launch(165, 167, correlation=2),
        nccl("allreduce", 170, 190, nelems=1000, correlation=2)])
    write_rank(tmp_path / "late", 1, [
        step(1, 0, 100), step(2, 100, 200), launch(125, 127, correlation=3),
        nccl("allreduce", 130, 190, nelems=1000, correlation=3)])
    late = analyze.open(tmp_path / "late")
    assert path_rows(device_paths(late)) == [
        [0, 0, 0, 0, 100 * us, 100 * us, None],  # no waits: the rank that ended it (of a tie, the lowest)
        [1, 0, 0, 110 * us, 170 * us, 60 * us, "allreduce kernel"], [1, 1, 1, 170 * us, 200 * us, 30 * us, None]]
    assert_device_paths_touch(late)
    # a run without device collectives has no such path
    assert device_paths(build(tmp_path / "otf2", lbann_steps(record=True), step_region=STEP)).empty


def test_the_devices_critical_path_of_dlrm(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # param's DLRM step on 8 V100s (values in the collectives table): rank 4's host ends the
    # step last, at 20.970 ms; its last kernel that waited is the allreduce of sequence 6, until
    # 17.829 ms, when rank 5's started; rank 5's last before that, the allreduce of sequence 4,
    # waited until 15.405 ms for rank 7's, and rank 7 waited in none: its step began at 7.660 ms,
    # the latest of the eight, and the other ranks' first all_to_all kernels waited up to 7.6 ms for it
    us = 1000
    got = device_paths(kineto_db("param_dlrm_v100_8rank"))
    assert path_rows(got[["rank", "start_ns", "end_ns", "via"]]) == [
        [7, 7660 * us, 15405 * us, "allreduce kernel"], [5, 15405 * us, 17829 * us, "allreduce kernel"],
        [4, 17829 * us, 20970 * us, None]]


def build(tmp_path: Path, items: list, **options: object) -> duckdb.DuckDBPyConnection:
    write_literal(tmp_path / "run", items)
    return analyze.open(tmp_path / "run", **options)


def test_name_only_collectives_are_waited_for_and_caused(tmp_path: Path) -> None:
    # LBANN's allreduce known by its name only: rank 1 reaches it 10 ms after rank 0 at both
    # steps, having spent those 10 ms in the step's own code (the training loop's region)
    db = build(tmp_path, lbann_steps(record=False), step_region=STEP)
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert db.execute("""SELECT rank, step, cause_rank, cause_kind, cause_region, sum(idle_ns) FROM delays
                         GROUP BY ALL ORDER BY step""").fetchall() == [
        (0, 0, 1, "region", STEP, 10 * MS), (0, 1, 1, "region", STEP, 10 * MS)]
    assert db.execute("""SELECT rank, sum(comm_ns), sum(hidden_ns) FROM overlap WHERE kind = 'allreduce'
                         GROUP BY rank ORDER BY rank""").fetchall() == [(0, 60 * MS, 0), (1, 40 * MS, 0)]
    assert_views_work(db)


def test_a_named_wait_is_exposed_allreduce(tmp_path: Path) -> None:
    # oneCCL: a non-blocking allreduce started for 1 ms and waited for 20 ms (the wait's
    # region takes the operation of the library's starts, regions.pattern_op)
    items = []
    for rank in (0, 1):
        items += oneccl_step(rank)
    db = build(tmp_path, items, step_region="train_step()")
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert_views_work(db)


def test_one_rank_without_step_markers(tmp_path: Path) -> None:
    # no step region: one step, the whole run; one rank: nobody to wait for or be caused by
    db = build(tmp_path, [(0, "main", 0, 50 * MS), (0, "MPI_Barrier", 10 * MS, 12 * MS, {"op": "barrier"}),
                          (0, "MPI_Allreduce", 20 * MS, 25 * MS, {"op": "allreduce", "bytes": 8})])
    assert db.execute("SELECT source, count(*) FROM steps GROUP BY ALL").fetchall() == [("whole_run", 1)]
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert db.execute("SELECT count(*) FROM delays").fetchall() == [(0,)]
    assert db.execute("SELECT kind, comm_ns FROM overlap ORDER BY kind").fetchall() == [
        ("all", 7 * MS), ("allreduce", 5 * MS), ("barrier", 2 * MS)]
    assert db.execute("SELECT step, duration_ns, path_ranks FROM step_balance").fetchall() == [(0, 50 * MS, 1)]
    assert_views_work(db)


def test_steps_with_nothing_inside_and_a_rank_with_fewer_steps(tmp_path: Path) -> None:
    # rank 0: three empty steps; rank 1: two, with an allreduce rank 0 never joins (unmatched)
    items = [(0, "dltrace.step", s * 10 * MS, (s * 10 + 5) * MS) for s in range(3)]
    items += [(1, "dltrace.step", s * 10 * MS, (s * 10 + 5) * MS) for s in range(2)]
    items += [(1, "MPI_Allreduce", 1 * MS, 2 * MS, {"op": "allreduce", "bytes": 8})]
    db = build(tmp_path, items)
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert db.execute("SELECT count(*) FROM step_balance").fetchall() == [(3,)]
    assert_views_work(db)


def test_timeline_names_accelerator_streams_as_such(kineto_db: Callable[[str], duckdb.DuckDBPyConnection]) -> None:
    # each rank's GPU has five streams with activity: kernels and copies on the first two, copies
    # on the third, NCCL kernels on the last two (84 and 203: 8 and 2 kernels), drawn under the
    # main thread's regions; the host has no communication lane
    from analyze.views import region_lanes

    db = kineto_db("hta_sampled_2rank")
    ((t0, t1),) = db.execute("SELECT min(start_ns), max(end_ns) FROM steps").fetchall()
    lanes = region_lanes(db, t0, t1)
    assert sorted(set(zip(lanes["rank"], lanes["label"], strict=True)) - {(0, ""), (1, "")}) == [
        (r, label) for r in (0, 1) for label in [*(f"device stream {k}" for k in range(5)), "regions"]]
    rank0 = lanes[(lanes["rank"] == 0) & (lanes["part"] != "wait")]
    fills = rank0.groupby("label")["fill"].agg(lambda f: sorted(set(f))).to_dict()
    assert fills == {"regions": ["forward", "optimizer"], "device stream 0": ["compute", "memory"],
                     "device stream 1": ["compute", "memory"], "device stream 2": ["memory"],
                     "device stream 3": ["other_comm"], "device stream 4": ["other_comm"]}
    assert rank0["label"].value_counts()[["device stream 3", "device stream 4"]].tolist() == [8, 2]


def test_a_step_of_length_zero_and_markers_on_one_rank_only(tmp_path: Path) -> None:
    ar = {"op": "allreduce", "bytes": 8}
    # step 1 lasts 0 ns on both ranks, and so does the allreduce at step 0
    items = [(r, "dltrace.step", s * 10 * MS, s * 10 * MS + (0 if s == 1 else 5 * MS)) for r in (0, 1) for s in range(3)]
    db = build(tmp_path / "zero", items + [(r, "MPI_Allreduce", 2 * MS, 2 * MS, ar) for r in (0, 1)])
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert db.execute("SELECT step, duration_ns FROM step_balance ORDER BY step").fetchall() == [
        (0, 5 * MS), (1, 0), (2, 5 * MS)]
    # rank 1 has no step markers, so no step to compare regions in: its 15 ms late arrival
    # is a late start of its (empty) synchronization interval
    db = build(tmp_path / "one", [(0, "dltrace.step", 0, 50 * MS), (0, "MPI_Allreduce", 10 * MS, 30 * MS, ar),
                                  (1, "main", 0, 50 * MS), (1, "dltrace.forward", 1 * MS, 25 * MS),
                                  (1, "MPI_Allreduce", 25 * MS, 30 * MS, ar)])
    assert mismatches(db) == {"idle": [], "exposed": [], "path": []}
    assert db.execute("SELECT cause_rank, cause_kind, idle_ns FROM delay_totals").fetchall() == [
        (1, "late_start", 15 * MS)]
    assert_views_work(db)


def test_device_waits_name_the_last_rank_and_why(tmp_path: Path) -> None:
    # rank 0's host begins step 2 10 us late (kineto_literal.late_kernels)
    db = analyze.open(late_kernels(tmp_path / "run", second_step_start=110))
    got = views.device_waits(db)
    assert got[["cause_rank", "instances", "waiting_ranks", "traced", "group_size"]].values.tolist() == [
        [0, 1, 1, 2, 2], [1, 1, 1, 2, 2]]
    assert got["steps"].tolist() == [[1], [0]]
    us = 1e-3  # ms
    assert np.allclose(got[["wait_ms", "before_ms", "busy_ms", "idle_ms"]].to_numpy(),
                       [[40 * us, 60 * us, 0, 60 * us], [20 * us, 60 * us, 50 * us, 10 * us]])
    assert np.allclose(got["share"], [2 / 3, 1 / 3])
    # why: at step 1, rank 1's allreduce sat 52 us on its device behind the gemm against rank
    # 0's 5 us (47 more), and its host spent 2 us launching the gemm: 20 us split 47 : 2; at
    # step 2, rank 0 began 10 us late and spent 45 us loading data before its launch (its
    # step's own code 10 us against rank 1's 25): 40 us split 45 : 10
    why = views.device_wait_causes(db)
    assert [(r, k, g, round(v / us, 6)) for r, k, g, v in why.itertuples(index=False)] == [
        (0, "region", "dataloader", round(40 * 45 / 55, 6)), (1, "device_queue", "", round(20 * 47 / 49, 6)),
        (0, "late_start", "", round(40 * 10 / 55, 6)), (1, "region", "cudaLaunchKernel", round(20 * 2 / 49, 6))]
    lines = views.device_wait_lines(db)
    assert lines[0].startswith("rank 0 started its collective kernels last 1 time at step 1: the others waited "
                               "0.04 ms in theirs (67% of all device waiting, up to 1 rank), because its host spent "
                               "longer in dataloader (0.0327 ms of it) and its host step began later (0.00727 ms of it)")
    assert ("because its kernels queued longer on its device (0.0192 ms of it) and its host spent longer in "
            "cudaLaunchKernel (816 ns of it)") in lines[1]
    # the host's phases see no waiting, and a run without device collectives has no device waits
    assert views.delay_lines(db) == []
    assert views.device_waits(build(tmp_path / "otf2", lbann_steps(record=True), step_region=STEP)).empty
