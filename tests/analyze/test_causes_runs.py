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
    """Rank 1 is a slower device: it runs its model four more times per batch without
    gradients (--extra-forwards 0,4), so a sample costs it about 7/3 of rank 0's (a forward
    and a backward pass cost about three forward passes) and the balanced share of rank 0 is
    about 0.7. Both start with half of each batch; each has one torch thread.

    On a quiet machine one round balances: with --extra-forwards 0,2 from 0.7/0.3 the ranks'
    compute went from 28% to 2% apart. But the two ranks share this VM, and a rank computes
    faster while the other waits, so a suggestion measured on a badly balanced run is biased
    (here, toward the rank that waited less), and a rank's cost per sample can change by a
    third from one run to the next (CI once went 24%, 16%, 18% apart over two rounds).
    Measured with 0,4 from 0.5/0.5 while CI ran beside: suggestions 0.632-0.689 and spreads
    42-55% going to 11-24%. So the test asks for the suggestion near the designed ratio and for
    the rerun to cut the imbalance by at least a quarter (docs/causes.md)."""
    common = ["runs/hetero_shares.py", "--global-batch", "64", "--threads", "1,1",
              "--extra-forwards", "0,4", "--steps", "12", "--image-size", "48"]
    db = analyze.open(traced(runs_dir, "hetero-0", *common, "--shares", "0.5,0.5").run_dir)
    before = compute_spread(db)
    assert before > 0.3, before  # rank 1 is clearly slower with equal shares
    shares = [v for (v,) in db.execute("select balanced_share from rank_balance order by rank").fetchall()]
    assert 0.6 <= shares[0] <= 0.8, shares  # the 7:3 cost per sample, within the noise above
    db = analyze.open(traced(runs_dir, "hetero-1", *common, "--shares",
                             ",".join(f"{v:.4f}" for v in shares)).run_dir)
    after = compute_spread(db)
    assert after < 0.75 * before, (before, after)
