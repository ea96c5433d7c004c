"""Phase model on literal traces with exact integer expectations."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyze
from tests.literal import write_literal

MS = 1_000_000


def phases_of(tmp_path: Path, items: list) -> dict[tuple[int, str], int]:
    write_literal(tmp_path / "run", items)
    db = analyze.open(tmp_path / "run")
    rows = db.sql("select rank, phase, sum(duration_ns) from phases group by all").fetchall()
    return {(r, p): int(ns) for r, p, ns in rows}


def test_late_rank_in_allreduce_makes_the_early_rank_idle(tmp_path: Path) -> None:
    coll = {"op": "allreduce", "bytes": 4096}
    got = phases_of(tmp_path, [
        (0, "dltrace.step", 0, 200 * MS), (0, "MPI_Allreduce", 100 * MS, 160 * MS, coll),
        (1, "dltrace.step", 0, 200 * MS), (1, "MPI_Allreduce", 150 * MS, 160 * MS, coll),
    ])
    # rank 1 arrives 50 ms after rank 0; both then transfer together for the 10 ms overlap
    assert got[(0, "idle")] == 50 * MS
    assert got[(0, "allreduce")] == 10 * MS
    assert got[(1, "allreduce")] == 10 * MS
    assert got[(1, "idle")] == 0
    assert got[(0, "compute")] == 140 * MS
    assert got[(1, "compute")] == 190 * MS


def test_collectives_table_matches_by_sequence(tmp_path: Path) -> None:
    coll = {"op": "allreduce", "bytes": 4096}
    write_literal(tmp_path / "run", [
        (0, "MPI_Allreduce", 10 * MS, 20 * MS, coll), (0, "MPI_Allreduce", 30 * MS, 40 * MS, coll),
        (1, "MPI_Allreduce", 15 * MS, 20 * MS, coll), (1, "MPI_Allreduce", 35 * MS, 40 * MS, coll),
    ])
    rows = analyze.open(tmp_path / "run").sql(
        "select rank, seq, bytes, last_arrival_ns, wait_ns, transfer_ns, ranks_matched "
        "from collectives order by rank, seq").fetchall()
    # times are relative to the trace start (10 ms)
    assert rows == [
        (0, 0, 4096, 5 * MS, 5 * MS, 5 * MS, 2), (0, 1, 4096, 25 * MS, 5 * MS, 5 * MS, 2),
        (1, 0, 4096, 5 * MS, 0, 5 * MS, 2), (1, 1, 4096, 25 * MS, 0, 5 * MS, 2),
    ]


def test_late_root_in_broadcast(tmp_path: Path) -> None:
    bcast = {"op": "bcast", "bytes": 1024, "root": 0}
    got = phases_of(tmp_path, [
        (0, "dltrace.step", 0, 200 * MS), (0, "MPI_Bcast", 120 * MS, 130 * MS, bcast),
        (1, "dltrace.step", 0, 200 * MS), (1, "MPI_Bcast", 100 * MS, 130 * MS, bcast),
        (2, "dltrace.step", 0, 200 * MS), (2, "MPI_Bcast", 125 * MS, 130 * MS, bcast),
    ])
    # non-roots wait for the root (rank 0, entering at 120 ms); a root never waits
    assert got[(0, "idle")] == 0 and got[(0, "other_comm")] == 10 * MS
    assert got[(1, "idle")] == 20 * MS and got[(1, "other_comm")] == 10 * MS
    assert got[(2, "idle")] == 0 and got[(2, "other_comm")] == 5 * MS


def test_late_sender_makes_the_receiver_idle(tmp_path: Path) -> None:
    got = phases_of(tmp_path, [
        (0, "dltrace.step", 0, 200 * MS), (0, "MPI_Send", 100 * MS, 110 * MS, {"send": 1, "tag": 7, "bytes": 64}),
        (1, "dltrace.step", 0, 200 * MS), (1, "MPI_Recv", 80 * MS, 112 * MS, {"recv": 0, "tag": 7, "bytes": 64}),
    ])
    assert got[(1, "idle")] == 20 * MS  # from its enter (80) to the send's enter (100)
    assert got[(1, "other_comm")] == 12 * MS
    assert got[(0, "other_comm")] == 10 * MS and got[(0, "idle")] == 0


def test_p2p_table_pairs_messages(tmp_path: Path) -> None:
    write_literal(tmp_path / "run", [
        (0, "MPI_Send", 0, 10 * MS, {"send": 1, "tag": 7, "bytes": 64}),
        (0, "MPI_Send", 20 * MS, 30 * MS, {"send": 1, "tag": 7, "bytes": 128}),
        (1, "MPI_Recv", 5 * MS, 12 * MS, {"recv": 0, "tag": 7, "bytes": 64}),
        (1, "MPI_Recv", 14 * MS, 31 * MS, {"recv": 0, "tag": 7, "bytes": 128}),
    ])
    rows = analyze.open(tmp_path / "run").sql(
        "select direction, peer, seq, bytes, partner_enter_ns, wait_ns from p2p "
        "where rank = 1 order by seq").fetchall()
    assert rows == [("recv", 0, 0, 64, 0, 0), ("recv", 0, 1, 128, 20 * MS, 6 * MS)]


def test_exclusive_time_of_nested_user_regions(tmp_path: Path) -> None:
    write_literal(tmp_path / "run", [
        (0, "outer", 0, 80 * MS), (0, "inner", 10 * MS, 40 * MS), (0, "inner", 50 * MS, 60 * MS),
        (0, "innermost", 20 * MS, 25 * MS),
    ])
    rows = analyze.open(tmp_path / "run").sql(
        "select r.name, i.depth, i.duration_ns, i.exclusive_ns from intervals i join regions r "
        "using (region_id) order by i.start_ns, i.depth").fetchall()
    assert rows == [
        ("outer", 0, 80 * MS, 40 * MS),
        ("inner", 1, 30 * MS, 25 * MS),
        ("innermost", 2, 5 * MS, 5 * MS),
        ("inner", 1, 10 * MS, 10 * MS),
    ]


@pytest.mark.parametrize(("rank1_arrives", "expect_idle", "expect_allreduce"), [
    (45, 0, 8),  # rank 0 waits for rank 1 while still computing backward: hidden
    (55, 5, 3),  # rank 1 arrives inside rank 0's wait: rank 0 is idle until then
])
def test_async_allreduce_counts_only_where_the_main_thread_waits(
    tmp_path: Path, rank1_arrives: int, expect_idle: int, expect_allreduce: int,
) -> None:
    items = []
    for rank, issue in ((0, 40), (1, rank1_arrives)):
        items += [
            (rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.backward", 10 * MS, 60 * MS),
            (rank, "ddp.wait_for_buckets", 50 * MS, 60 * MS, {"role": "wait"}),
            (rank, "torch.distributed.all_reduce", issue * MS, 58 * MS,
             {"op": "allreduce", "bytes": 100, "lane": True}),
        ]
    got = phases_of(tmp_path, items)
    assert got[(0, "idle")] == expect_idle * MS
    assert got[(0, "allreduce")] == expect_allreduce * MS
    assert got[(0, "compute")] == (100 - expect_idle - expect_allreduce) * MS


def test_phases_add_up_to_steps_and_summary(tmp_path: Path) -> None:
    coll = {"op": "allreduce", "bytes": 8}
    items = []
    for step in range(3):
        base = step * 100 * MS
        for rank in (0, 1):
            items += [(rank, "dltrace.step", base, base + 90 * MS),
                      (rank, "MPI_Allreduce", base + (50 + 10 * rank) * MS, base + 80 * MS, coll)]
    write_literal(tmp_path / "run", items)
    db = analyze.open(tmp_path / "run")
    mismatch = db.sql("""
        select s.rank, s.step from steps s join phases p using (rank, step)
        group by s.rank, s.step, s.duration_ns having sum(p.duration_ns) <> s.duration_ns
    """).fetchall()
    assert mismatch == []
    assert db.execute("select count(*) from steps").fetchone() == (6,)
    from analyze.tables.phases import summary

    table = summary(db)
    assert list(table["steps"]) == [3, 3]
    assert table.loc[0, "idle%"] == pytest.approx(100 * 10 / 90, abs=0.05)


def test_windowed_sweep_gives_the_same_phases_as_one_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build_phases sweeps a few steps at a time on long traces; the windows must not show."""
    from analyze.tables import phases
    from bench import synth

    run, _ = synth.write(30_000, tmp_path / "run")  # the benchmark's DDP-like steps, 2 ranks
    whole = analyze.build(run, db=tmp_path / "whole.duckdb").db
    monkeypatch.setattr(phases, "WINDOW_SEGMENTS", 100)  # a window of a step or two
    windowed = analyze.build(run, db=tmp_path / "windowed.duckdb").db
    query = "SELECT rank, step, phase, duration_ns FROM phases ORDER BY ALL"
    a = duckdb.connect(str(whole), read_only=True).execute(query).fetchall()
    b = duckdb.connect(str(windowed), read_only=True).execute(query).fetchall()
    assert len(a) > 500 and a == b


@pytest.mark.parametrize("window", [10_000, 300, 100])
def test_a_groups_ranks_batched_or_held_give_the_phases_of_the_sql(
        window: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The phase stage counts each rank's main-thread intervals itself and sweeps a group's
    ranks together while they hold about WINDOW_SEGMENTS (its intervals kept), in batches
    (read again for each) or a rank alone in windows: every way gives the phases of the SQL
    that counts and finds the segments itself."""
    from analyze.engine.local import LocalEngine
    from analyze.tables import phases, stages
    from bench import synth

    run, _ = synth.write(12_000, tmp_path / "run", ranks=4)  # one group of 4 ranks, ~200 main intervals each
    monkeypatch.setattr(phases, "WINDOW_SEGMENTS", window)
    batches: list[list[int]] = []
    sweep_ranks = phases._sweep_ranks
    monkeypatch.setattr(phases, "_sweep_ranks", lambda steps, ranks, *rest: batches.append(ranks) or sweep_ranks(
        steps, ranks, *rest))
    ours = analyze.build(run, db=tmp_path / "ours.duckdb", engine=LocalEngine(1)).db
    assert {10_000: [[0, 1, 2, 3]], 300: [[0], [1], [2], [3]], 100: []}[window] == batches
    monkeypatch.setattr(stages, "_segments_in_memory", lambda *args: (None, None))  # counted and found in SQL
    sql = analyze.build(run, db=tmp_path / "sql.duckdb", engine=LocalEngine(1)).db
    query = "SELECT rank, step, phase, duration_ns FROM phases ORDER BY ALL"
    a = duckdb.connect(str(ours), read_only=True).execute(query).fetchall()
    b = duckdb.connect(str(sql), read_only=True).execute(query).fetchall()
    assert len(a) > 200 and a == b


@pytest.mark.parametrize("values", [[], [5], [3, 1, 3, 2, 1], list(range(10, 0, -1)) * 3,
                                    [-(1 << 62), 0, 1 << 62, 0, -1]])
def test_the_sweeps_unique_with_inverse_is_numpys(values: list[int]) -> None:
    import numpy as np

    from analyze.tables.phases import _unique_inverse

    v = np.array(values, dtype=np.int64)
    want_bounds, want_at = np.unique(v, return_inverse=True)
    bounds, at = _unique_inverse(v)
    assert bounds.tolist() == want_bounds.tolist() and at.tolist() == want_at.ravel().tolist()
