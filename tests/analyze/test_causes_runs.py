"""Real 2-rank runs: DDP's buckets overlap backward, a straggling data loader is named as the
cause of the other rank's idle time, and the suggested shares balance unequal ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

import analyze
from analyze.tables.causes import views
from tests.conftest import Run, instrument_run

SCRIPTS = Path(__file__).parent / "scripts"

pytestmark = pytest.mark.slow


def traced(out: Path, name: str, *args: str) -> Run:
    run = instrument_run(out, "-np", "2", *args, name=name)
    assert run.proc.returncode == 0, run.output
    return run


def assert_consistent(db) -> None:  # type: ignore[no-untyped-def]
    """The cause tables agree with the phases: idle attributed sums to idle, exposed
    communication is the phases' communication and idle, critical paths add up."""
    assert db.execute("""
        select count(*) from phases p
        left join (select rank, step, sum(idle_ns) as ns from delays group by all) d using (rank, step)
        where p.phase = 'idle' and p.duration_ns <> coalesce(d.ns, 0)""").fetchall() == [(0,)]
    assert db.execute("""
        select count(*) from overlap o
        join (select rank, step, sum(duration_ns) filter (where phase in ('allreduce', 'other_comm', 'idle')) as ns
              from phases group by all) p using (rank, step)
        where o.kind = 'all' and o.exposed_ns <> p.ns""").fetchall() == [(0,)]
    assert db.execute("""
        select count(*) from step_balance s
        join (select step, sum(duration_ns) as ns from critical_path_regions group by step) r using (step)
        where r.ns <> s.duration_ns""").fetchall() == [(0,)]


def test_ddp_buckets_are_hidden_under_backward(runs_dir: Path) -> None:
    # 0.1 MB buckets: the compact model's 0.7 MB of gradients go out in about six buckets,
    # the first while backward still computes the layers nearer the input
    run = traced(runs_dir, "ddp-buckets", "runs/ddp_resnet.py", "--steps", "4", "--batch-size", "16",
                 "--bucket-cap-mb", "0.1")
    db = analyze.open(run.run_dir)
    rows = db.execute("""select rank, sum(hidden_ns), sum(comm_ns), min(calls) filter (where step > 0)
                     from overlap where kind = 'allreduce' group by rank order by rank""").fetchall()
    assert [r[0] for r in rows] == [0, 1]
    for rank, hidden, comm, calls in rows:
        assert calls >= 2, rank  # several buckets per step once DDP has rebuilt its buckets
        assert 0 < hidden < comm, rank
    assert_consistent(db)


def test_a_straggling_data_loader_is_named_as_the_cause(runs_dir: Path) -> None:
    # rank 1 sleeps 300 ms in each batch's data loading; a step's compute (a small MLP on 8
    # samples) takes about a millisecond, so the sleep is what rank 0 waits for. Except at
    # step 1: there DDP rebuilds its buckets with a broadcast inside forward that the tracer
    # does not see (C++), so rank 0 waits in "forward" and is not idle at the allreduce.
    run = traced(runs_dir, "slow-loader", str(SCRIPTS / "slow_loader.py"), "--steps", "5",
                 "--slow-rank", "1", "--sleep-ms", "300")
    db = analyze.open(run.run_dir)
    top = db.execute("select cause_rank, cause_kind, cause_region, share, main_steps from delay_totals").fetchall()[0]
    assert top[:3] == (1, "region", "dltrace.dataloader") and top[3] > 0.8, top
    assert set(top[4]) >= {2, 3, 4}
    ((idle_ms, share),) = db.execute("""
        select sum(idle_ns) / 1e6,
               sum(idle_ns) filter (where cause_rank = 1 and cause_region = 'dltrace.dataloader') / sum(idle_ns)
        from delays where rank = 0""").fetchall()
    assert idle_ms > 4 * 300 * 0.8 and share > 0.8  # about the sleep, at four steps of five
    assert views.delay_lines(db)[0].startswith("rank 1's dltrace.dataloader at steps ")
    assert_consistent(db)


def compute_spread(db) -> float:  # type: ignore[no-untyped-def]
    c = [v for (v,) in db.execute("select compute_ms from rank_balance order by rank").fetchall()]
    return abs(c[0] - c[1]) / max(c)


def test_suggested_shares_balance_unequal_ranks(runs_dir: Path) -> None:
    """Rank 1 is a slower device: it runs its model twice more per batch without gradients
    (--extra-forwards 0,2), so a sample costs it about 5/3 of rank 0's, and rank 0 starts with
    70% of each batch. Each rank has one torch thread, so on this 2-core machine neither takes
    the other's core (with --threads 2,1 they did, and a suggestion measured while one rank
    waited over-corrected: CI once ended 11% apart after two rounds).

    Measured here: 28% apart before, 2% after one round; under three busy loops beside the run,
    0.3% and 5.5%. The test still allows a second round for a machine busier than that."""
    common = ["runs/hetero_shares.py", "--global-batch", "64", "--threads", "1,1",
              "--extra-forwards", "0,2", "--steps", "12", "--image-size", "48"]
    db = analyze.open(traced(runs_dir, "hetero-0", *common, "--shares", "0.7,0.3").run_dir)
    spreads = [compute_spread(db)]
    assert spreads[0] > 0.15  # not balanced to begin with, so the check below can fail
    for round_ in (1, 2):
        shares = [v for (v,) in db.execute("select balanced_share from rank_balance order by rank").fetchall()]
        db = analyze.open(traced(runs_dir, f"hetero-{round_}", *common, "--shares",
                                 ",".join(f"{v:.4f}" for v in shares)).run_dir)
        spreads.append(compute_spread(db))
        if spreads[-1] <= 0.10:
            break
    assert spreads[-1] <= 0.10, spreads
