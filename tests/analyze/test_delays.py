"""Root causes of waiting (the delays table) on literal traces with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyze
from tests.literal import write_literal

MS = 1_000_000
COLL = {"op": "allreduce", "bytes": 4096}


def step(rank: int, base: int, data: int, fwd: int, bwd: int, opt: int = 10, start: int = 0,
         arrive_extra: int = 0) -> list[tuple]:
    """One training step of ``rank`` from ``base + start`` ms: data loading, forward, backward
    (each the given ms), a blocking allreduce until the last rank arrives, then the optimizer.
    The allreduce ends 10 ms after ``base + 140`` ms; the step at its optimizer's end."""
    t = base + start
    items = [(rank, "dltrace.dataloader", t * MS, (t + data) * MS)]
    t += data
    items.append((rank, "dltrace.forward", t * MS, (t + fwd) * MS))
    t += fwd
    items.append((rank, "dltrace.backward", t * MS, (t + bwd) * MS))
    t += bwd + arrive_extra
    items.append((rank, "MPI_Allreduce", t * MS, (base + 150) * MS, COLL))
    items.append((rank, "dltrace.optimizer", (base + 150) * MS, (base + 150 + opt) * MS))
    items.append((rank, "dltrace.step", (base + start) * MS, (base + 150 + opt) * MS))
    return items


def build(tmp_path: Path, items: list) -> analyze.AnalyzeError:  # type: ignore[valid-type]
    write_literal(tmp_path / "run", items)
    return analyze.open(tmp_path / "run")


def causes(db) -> dict[tuple, int]:  # type: ignore[no-untyped-def]
    rows = db.sql("""select rank, step, cause_rank, cause_kind, cause_region, sum(idle_ns)
                     from delays group by all""").fetchall()
    return {tuple(r[:5]): int(r[5]) for r in rows}


def assert_idle_sums(db) -> None:  # type: ignore[no-untyped-def]
    """The idle attributed to causes is the phases' idle, rank by rank and step by step."""
    mismatch = db.sql("""
        select p.rank, p.step, p.duration_ns, d.ns
        from phases p left join (select rank, step, sum(idle_ns) as ns from delays group by all) d
             using (rank, step)
        where p.phase = 'idle' and p.duration_ns <> coalesce(d.ns, 0)
    """).fetchall()
    assert mismatch == []


def test_a_rank_late_by_its_data_loading(tmp_path: Path) -> None:
    # rank 1 loads for 40 ms instead of 10, so it reaches the allreduce at 140 ms, rank 0 at 110
    db = build(tmp_path, step(0, 0, 10, 50, 50) + step(1, 0, 40, 50, 50))
    assert causes(db) == {(0, 0, 1, "region", "dltrace.dataloader"): 30 * MS}
    assert db.sql("select cause_category, excess_ns from delays").fetchall() == [("dataloader", 30 * MS)]
    assert_idle_sums(db)


def test_a_rank_late_by_its_backward(tmp_path: Path) -> None:
    db = build(tmp_path, step(0, 0, 10, 50, 50) + step(1, 0, 10, 50, 70))
    assert causes(db) == {(0, 0, 1, "region", "dltrace.backward"): 20 * MS}
    assert_idle_sums(db)


def test_idle_split_over_regions_in_proportion_to_their_excess(tmp_path: Path) -> None:
    # rank 1: 10 ms more data loading and 30 ms more backward, 5 ms less forward; the
    # excesses are +10 and +30 (the shorter forward is no cause), the wait 35 ms
    db = build(tmp_path, step(0, 0, 10, 50, 50) + step(1, 0, 20, 45, 80))
    got = causes(db)
    assert got == {(0, 0, 1, "region", "dltrace.dataloader"): 8_750_000,   # 35 ms x 10/40
                   (0, 0, 1, "region", "dltrace.backward"): 26_250_000}    # 35 ms x 30/40
    assert_idle_sums(db)


def test_a_late_start_is_a_propagated_delay(tmp_path: Path) -> None:
    # rank 1 starts its step 5 ms late and computes exactly as long: nothing in its step
    # made it late
    db = build(tmp_path, step(0, 0, 10, 50, 50) + step(1, 0, 10, 50, 50, start=5))
    assert causes(db) == {(0, 0, 1, "late_start", None): 5 * MS}
    assert_idle_sums(db)


def test_late_sender_attributed_to_the_senders_forward(tmp_path: Path) -> None:
    db = build(tmp_path, [
        (0, "dltrace.step", 0, 100 * MS), (0, "dltrace.forward", 0, 60 * MS),
        (0, "MPI_Send", 60 * MS, 70 * MS, {"send": 1, "tag": 1, "bytes": 64}),
        (1, "dltrace.step", 0, 100 * MS), (1, "dltrace.forward", 0, 20 * MS),
        (1, "MPI_Recv", 20 * MS, 72 * MS, {"recv": 0, "tag": 1, "bytes": 64}),
    ])
    assert causes(db) == {(1, 0, 0, "region", "dltrace.forward"): 40 * MS}
    assert db.sql("select op, cause_enter_ns from delays").fetchall() == [("p2p", 60 * MS)]
    assert_idle_sums(db)


def test_totals_name_the_rank_the_region_and_the_steps(tmp_path: Path) -> None:
    """Three ranks, four steps: rank 2's data loading is 30 ms slow at steps 1-2, so ranks 0
    and 1 wait 30 ms each there."""
    items = []
    for s in range(4):
        for rank in range(3):
            slow = rank == 2 and s in (1, 2)
            items += step(rank, 200 * s, 40 if slow else 10, 50, 50)
    db = build(tmp_path, items)
    top = db.sql("""select cause_rank, cause_kind, cause_region, idle_ns, share, waiting_ranks,
                           steps, first_step, last_step, main_steps
                    from delay_totals""").fetchall()
    assert top == [(2, "region", "dltrace.dataloader", 4 * 30 * MS, 1.0, 2, 2, 1, 2, [1, 2])]
    from analyze.tables.causes import views

    assert views.delay_lines(db) == [
        "rank 2's dltrace.dataloader at steps 1-2 caused 120.0 ms of idle on 2 ranks (100% of all idle)"]
    assert_idle_sums(db)


@pytest.mark.parametrize(("issue1", "expect"), [
    (45, {}),  # rank 0 waits for rank 1's bucket while still in backward: hidden, no idle
    (55, {(0, 0, 1, "region", "dltrace.backward"): 5 * MS}),  # idle from its wait at 50 to 55
])
def test_bucket_on_a_lane_caused_by_the_last_rank_to_issue_it(tmp_path: Path, issue1: int,
                                                              expect: dict) -> None:
    items = []
    for rank, issue in ((0, 40), (1, issue1)):
        items += [
            (rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.backward", 10 * MS, 60 * MS),
            (rank, "ddp.wait_for_buckets", max(issue, 50) * MS, 60 * MS, {"role": "wait"}),
            (rank, "torch.distributed.all_reduce", issue * MS, 58 * MS,
             {"op": "allreduce", "bytes": 100, "lane": True}),
            (rank, "dltrace.optimizer", 60 * MS, 70 * MS),
        ]
    db = build(tmp_path, items)
    # rank 1 spent 45 ms in backward before issuing, rank 0 30 ms: backward's excess is the
    # only positive one, so it gets the whole idle time
    assert causes(db) == expect
    assert_idle_sums(db)


def test_idle_times_read_without_exponents() -> None:
    from analyze.tables.causes.views import ms

    assert [ms(120e6), ms(1.25e6), ms(12_300), ms(1_000), ms(40), ms(0)] == \
        ["120.0 ms", "1.25 ms", "0.0123 ms", "0.001 ms", "40 ns", "0 ms"]
