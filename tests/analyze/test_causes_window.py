"""The pass over windows of steps, and the time per region the cause analyses sum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import analyze
from analyze.tables.causes.region_time import NO_REGION, region_times
from analyze.tables.causes.window import all_steps
from analyze.tables.phases import split_by_rank
from tests.literal import write_literal

MS = 1_000_000


def test_region_times_are_exclusive_and_add_up(tmp_path: Path) -> None:
    write_literal(tmp_path / "run", [
        (0, "dltrace.step", 0, 100 * MS),
        (0, "dltrace.forward", 10 * MS, 50 * MS),
        (0, "augment", 20 * MS, 30 * MS),  # a user region nested in forward
        (0, "dltrace.backward", 50 * MS, 90 * MS),
        (0, "ddp.wait_for_buckets", 80 * MS, 90 * MS, {"role": "wait"}),
        (0, "dltrace.step", 120 * MS, 150 * MS),
        (0, "dltrace.forward", 120 * MS, 150 * MS),
    ])
    db = analyze.open(tmp_path / "run")
    names = dict(db.execute("select region_id, name from regions").fetchall())
    # query 0: 15-85 ms of step 0; query 1: all of step 1; query 2: outside the steps
    got = region_times(db, np.array([0, 0, 0]), np.array([0, 1, -1]), np.array([15, 120, 100]) * MS,
                       np.array([85, 150, 110]) * MS)
    rows = sorted((int(q), names.get(int(r), "none" if r == NO_REGION else "?"), int(ns))
                  for q, r, ns in got.itertuples(index=False))
    assert rows == [
        (0, "augment", 10 * MS), (0, "ddp.wait_for_buckets", 5 * MS), (0, "dltrace.backward", 30 * MS),
        (0, "dltrace.forward", 25 * MS),  # 15-50 without the 10 ms of augment
        (1, "dltrace.forward", 30 * MS),  # the step region is all forward: no exclusive time
        (2, "none", 10 * MS),
    ]
    # the steps handed over (as the cause build does, from the steps it holds) give the same
    # rows as the steps read from the run
    given = region_times(db, np.array([0, 0, 0]), np.array([0, 1, -1]), np.array([15, 120, 100]) * MS,
                         np.array([85, 150, 110]) * MS, all_steps(db))
    assert given.sort_values(["q", "region"]).values.tolist() == got.sort_values(["q", "region"]).values.tolist()


def test_windows_of_a_step_or_two_give_the_same_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Long traces are analyzed a few steps at a time; the windows must not show."""
    import duckdb

    from analyze.tables.causes import region_time, window
    from bench import synth

    run, _ = synth.write(10_000, tmp_path / "run")  # 45 of the benchmark's DDP-like steps, 2 ranks
    whole = analyze.build(run, db=tmp_path / "whole.duckdb", causes=True).db
    monkeypatch.setattr(window, "WINDOW_INTERVALS", 400)  # windows of 4 steps
    sizes = []  # distinct steps in each statement summing time per region (memory follows them)
    whole_run = region_time.region_times

    def recording(con, rank, step, b, e, steps=None):  # type: ignore[no-untyped-def]
        sizes.append(len(np.unique(step[step >= 0])))
        return whole_run(con, rank, step, b, e, steps)

    monkeypatch.setattr(region_time, "region_times", recording)
    windowed = analyze.build(run, db=tmp_path / "windowed.duckdb", causes=True).db
    assert len(sizes) > 5 and max(sizes) <= 5, sizes  # a window's steps, never the run's 45
    for table in ("overlap", "delays", "delay_totals", "critical_path", "critical_path_regions",
                  "step_balance", "rank_balance"):
        query = f"SELECT * FROM {table} ORDER BY ALL"
        a = duckdb.connect(str(whole), read_only=True).execute(query).fetchall()
        b = duckdb.connect(str(windowed), read_only=True).execute(query).fetchall()
        assert a == b and len(a) > 0, table


def test_phases_alone_leave_the_cause_tables_to_the_first_verb_that_reads_them(tmp_path: Path) -> None:
    from analyze.tables import database

    coll = {"op": "allreduce", "bytes": 8}
    write_literal(tmp_path / "run", [
        (0, "dltrace.step", 0, 10 * MS), (0, "MPI_Allreduce", 2 * MS, 9 * MS, coll),
        (1, "dltrace.step", 0, 10 * MS), (1, "MPI_Allreduce", 5 * MS, 9 * MS, coll),
    ])
    paths = database.build(tmp_path / "run")  # what analyze phases builds
    assert not database.has_causes(paths)
    built = paths.db.stat().st_mtime_ns
    db = analyze.open(tmp_path / "run")  # fills them into the same, still current database
    assert database.has_causes(paths) and paths.db.stat().st_mtime_ns != built
    assert db.execute("select rank, idle_ns from delays").fetchall() == [(0, 3 * MS)]
    assert db.execute("select count(*) from phases").fetchall() == [(10,)]  # the rest as it was


def test_rows_split_by_rank_keep_their_order() -> None:
    """The cause passes split their rows by rank once (not a mask per rank): each rank gets
    its rows in their order, whatever order the ranks come in."""
    rank = np.array([3, 1, 3, 0, 1, 3])
    got = split_by_rank({"rank": rank, "value": np.arange(6)})
    assert list(got) == [0, 1, 3]
    assert {r: list(c["value"]) for r, c in got.items()} == {0: [3], 1: [1, 4], 3: [0, 2, 5]}
    assert split_by_rank({"rank": np.zeros(0, np.int64)}) == {}


def test_a_wait_across_the_windows_edge_still_names_who_arrived_last(tmp_path: Path) -> None:
    """A window reads the collectives once and finds the last arrival among its own rows; a
    collective across its edge, whose last member arrived after the window ends, is looked up
    in the whole table: the same cause as from a window holding every member."""
    from analyze.tables.causes.window import _collectives

    coll = {"op": "allreduce", "bytes": 8}
    write_literal(tmp_path / "run", [
        (0, "MPI_Allreduce", 0, 60 * MS, coll), (1, "MPI_Allreduce", 10 * MS, 60 * MS, coll),
        (2, "MPI_Allreduce", 50 * MS, 60 * MS, coll), (3, "MPI_Allreduce", 50 * MS, 60 * MS, coll),
        (0, "MPI_Allreduce", 90 * MS, 110 * MS, coll), (1, "MPI_Allreduce", 100 * MS, 110 * MS, coll),
        (2, "MPI_Allreduce", 90 * MS, 110 * MS, coll), (3, "MPI_Allreduce", 90 * MS, 110 * MS, coll),
    ])
    db = analyze.open(tmp_path / "run")

    def causes(t0: int, t1: int) -> dict[tuple[int, int], int | None]:
        rows = _collectives(db, t0 * MS, t1 * MS)
        return {(int(r.rank), int(r.enter_ns) // MS): None if pd.isna(r.cause_rank) else int(r.cause_rank)
                for r in rows.itertuples()}

    whole = causes(0, 200)
    assert whole[(0, 0)] == 2 and whole[(1, 10)] == 2  # ranks 2 and 3 arrived last together: the lower
    assert whole[(2, 50)] is None and whole[(0, 90)] == 1 and whole[(1, 100)] is None
    edge = causes(0, 40)  # ranks 2 and 3 entered after the window: only ranks 0 and 1 are in it
    assert edge == {(0, 0): 2, (1, 10): 2}
    late = causes(95, 200)  # the second allreduce, its last arrival (100) inside
    assert late == {(0, 90): 1, (1, 100): None, (2, 90): 1, (3, 90): 1}


def test_the_steps_a_window_asks_for_are_found_as_isin_finds_them() -> None:
    """region_time._rows_of: a binary search in the run's sorted step keys (duplicates and all),
    and np.isin where the keys are not sorted."""
    from analyze.tables.causes.region_time import _rows_of

    rng = np.random.default_rng(0)
    for trial in range(500):
        keys = np.sort(rng.integers(0, 15, rng.integers(0, 30))).astype(np.int64)
        if trial % 3 == 0:
            rng.shuffle(keys)
        wanted = rng.integers(-2, 18, rng.integers(0, 10)).astype(np.int64)
        assert _rows_of(keys, wanted).tolist() == np.flatnonzero(np.isin(keys, wanted)).tolist()
