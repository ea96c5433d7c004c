"""Communication/computation overlap (the overlap table) on literal traces with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyze
from tests.literal import write_literal

MS = 1_000_000
BUCKET = {"op": "allreduce", "bytes": 1 << 20, "lane": True}


def ddp_step(rank: int, buckets: list[tuple[int, int]], sync_allreduce: bool = False) -> list[tuple]:
    """A DDP-like step: forward 0-30 ms, backward 30-80 ms whose last 10 ms wait for the
    buckets (80-90 with a blocking allreduce after backward), optimizer to the end; buckets
    (start, end) in ms on the communication lane."""
    items = [(rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.forward", 0, 30 * MS),
             (rank, "dltrace.backward", 30 * MS, 80 * MS),
             (rank, "ddp.wait_for_buckets", 70 * MS, 80 * MS, {"role": "wait"}),
             (rank, "dltrace.optimizer", 90 * MS, 100 * MS)]
    items += [(rank, "torch.distributed.all_reduce", a * MS, b * MS, BUCKET) for a, b in buckets]
    if sync_allreduce:
        items.append((rank, "MPI_Allreduce", 80 * MS, 90 * MS, {"op": "allreduce", "bytes": 8}))
    return items


def overlap_of(tmp_path: Path, items: list) -> tuple[dict, object]:
    write_literal(tmp_path / "run", items)
    db = analyze.open(tmp_path / "run")
    rows = db.sql("""select rank, kind, calls, comm_ns, busy_ns, hidden_ns, exposed_ns, overlap_ratio
                     from overlap""").fetchall()
    return {(r[0], r[1]): r[2:] for r in rows}, db


def assert_exposed_is_the_phases_communication(db) -> None:  # type: ignore[no-untyped-def]
    mismatch = db.sql("""
        select o.rank, o.step, o.exposed_ns, p.ns
        from overlap o join (select rank, step, sum(duration_ns) filter (
                                 where phase in ('allreduce', 'other_comm', 'idle')) as ns
                             from phases group by all) p using (rank, step)
        where o.kind = 'all' and o.exposed_ns <> p.ns
    """).fetchall()
    assert mismatch == []


@pytest.mark.parametrize(("buckets", "hidden", "exposed"), [
    ([(40, 60)], 20, 0),  # fully hidden: reduced while backward still computes
    ([(60, 80)], 10, 10),  # half hidden: its second half falls into the wait for the buckets
    ([(70, 80)], 0, 10),  # exposed: issued when backward already waits
])
def test_bucket_allreduce_hidden_half_hidden_exposed(tmp_path: Path, buckets: list, hidden: int,
                                                     exposed: int) -> None:
    got, db = overlap_of(tmp_path, ddp_step(0, buckets) + ddp_step(1, buckets))
    total = hidden + exposed
    for kind in ("allreduce", "all"):
        assert got[(0, kind)] == (1, total * MS, total * MS, hidden * MS, exposed * MS, hidden / total)
    assert_exposed_is_the_phases_communication(db)


def test_blocking_allreduce_after_backward_is_never_hidden(tmp_path: Path) -> None:
    got, db = overlap_of(tmp_path, ddp_step(0, [], sync_allreduce=True) + ddp_step(1, [], sync_allreduce=True))
    assert got[(0, "allreduce")] == (1, 10 * MS, 10 * MS, 0, 10 * MS, 0.0)
    assert_exposed_is_the_phases_communication(db)


def test_concurrent_lanes_count_once_in_comm_and_twice_in_busy(tmp_path: Path) -> None:
    # Horovod-like: two reductions in flight together on two lanes, issued during backward
    items = []
    for rank in (0, 1):
        items += ddp_step(rank, [(40, 60)])
        items.append((rank, "torch.distributed.all_reduce", 50 * MS, 75 * MS, {**BUCKET, "lane": 1}))
    got, db = overlap_of(tmp_path, items)
    # union 40-75 = 35 ms, of which 40-70 hidden under backward; summed over lanes 20 + 25
    assert got[(0, "allreduce")] == (2, 35 * MS, 45 * MS, 30 * MS, 5 * MS, 30 / 35)
    assert_exposed_is_the_phases_communication(db)


def test_kinds_are_kept_apart_and_all_is_their_union(tmp_path: Path) -> None:
    items = []
    for rank in (0, 1):
        items += ddp_step(rank, [(40, 60)])
        items.append((rank, "torch.distributed.broadcast", 50 * MS, 75 * MS,
                      {"op": "bcast", "bytes": 64, "root": 0, "lane": 1}))
    got, db = overlap_of(tmp_path, items)
    assert got[(0, "allreduce")][1:4] == (20 * MS, 20 * MS, 20 * MS)
    assert got[(0, "bcast")][1:4] == (25 * MS, 25 * MS, 20 * MS)
    assert got[(0, "all")] == (2, 35 * MS, 45 * MS, 30 * MS, 5 * MS, 30 / 35)
    assert_exposed_is_the_phases_communication(db)


def test_a_step_without_communication_has_an_all_row_of_zeros(tmp_path: Path) -> None:
    got, _ = overlap_of(tmp_path, [(0, "dltrace.step", 0, 10 * MS), (0, "dltrace.forward", 0, 5 * MS)])
    assert got == {(0, "all"): (0, 0, 0, 0, 0, None)}


def test_groups_of_ranks_average_their_ranks_steps(tmp_path: Path) -> None:
    """What `analyze overlap` prints above 64 ranks: per group of consecutive ranks, the mean
    over its ranks' steps, and the overlap ratio of their summed time."""
    from analyze.tables.causes import views

    items = [*ddp_step(0, [(40, 60)]), *ddp_step(1, [(40, 75)]), *ddp_step(2, [(40, 85)])]
    _, db = overlap_of(tmp_path, items)
    per_rank = views.overlap_summary(db).set_index(["rank", "kind"])
    got = views.overlap_summary(db, 2)
    assert list(got["ranks"]) == ["0-1", "0-1", "2", "2"] and list(got["kind"]) == ["all", "allreduce"] * 2
    first = got.iloc[0]
    hidden = [per_rank.loc[(r, "all"), "hidden_ms"] for r in (0, 1)]
    comm = [per_rank.loc[(r, "all"), "comm_ms"] for r in (0, 1)]
    assert first["steps/rank"] == 1.0 and first["hidden_ms"] == pytest.approx(sum(hidden) / 2, abs=1e-3)
    assert first["overlap"] == pytest.approx(sum(hidden) / sum(comm), abs=1e-3)
    alone = got.iloc[2]  # a group of one rank: that rank's row
    for c in ("comm_ms", "busy_ms", "hidden_ms", "exposed_ms", "overlap"):
        assert alone[c] == per_rank.loc[(2, "all"), c], c
