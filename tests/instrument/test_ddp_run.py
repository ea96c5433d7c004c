"""End to end: ``instrument run`` on 2 ranks of runs/ddp_resnet.py, read back and analyzed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import analyze
from tests.conftest import DDP_STEPS as STEPS
from tests.conftest import Run, instrument_run

pytestmark = pytest.mark.slow




@pytest.fixture(scope="module")
def out(runs_dir: Path) -> Path:
    return runs_dir


@pytest.fixture(scope="module")
def traced(ddp_run: Run) -> Run:
    return ddp_run


@pytest.fixture(scope="module")
def db(traced: Run):  # type: ignore[no-untyped-def]
    return analyze.open(traced.run_dir)


def test_summary_line_and_run_json(traced: Run) -> None:
    assert re.search(r"trace written: .*ddp/traces.otf2 +\(2 ranks, 4 steps, [\d,]+ events\)", traced.proc.stdout)
    info = traced.info
    assert info["status"] == "ok" and info["complete"] is True
    assert info["ranks"] == 2 and info["tracer"] == "builtin"
    assert info["framework"] == "pytorch-ddp"
    assert info["params"] == {"steps": STEPS, "batch_size": 16}
    assert info["versions"]["torch"].startswith("2.13")
    assert [r["exit_status"] for r in info["rank_info"]] == [0, 0]
    assert "[rank 0] step 0 loss" in traced.proc.stdout
    assert "[rank 1] rank 1 done: 4 steps" in traced.proc.stdout


def test_two_main_locations_and_balanced_regions(db) -> None:  # type: ignore[no-untyped-def]
    assert db.execute("select rank, count(*) from locations where is_main group by rank order by rank").fetchall() == [
        (0, 1), (1, 1)]
    assert db.execute("select count(*) from intervals where truncated").fetchone() == (0,)
    assert db.execute("select value from build_info where key = 'unmatched_leaves'").fetchone() == ("0",)


def test_each_step_has_one_optimizer_and_allreduces_of_the_gradient_bytes(traced: Run, db) -> None:  # type: ignore[no-untyped-def]
    steps = db.execute("select rank, count(*) from steps group by rank order by rank").fetchall()
    assert steps == [(0, STEPS), (1, STEPS)]
    per_step = db.execute("""
        select s.rank, s.step,
               (select count(*) from intervals i join regions r using (region_id)
                where i.rank = s.rank and r.name = 'dltrace.optimizer'
                  and i.start_ns >= s.start_ns and i.end_ns <= s.end_ns) as optimizers,
               (select count(*) from collectives c where c.rank = s.rank and c.op = 'allreduce'
                  and c.enter_ns >= s.start_ns and c.enter_ns < s.end_ns) as allreduces,
               (select sum(bytes) from collectives c where c.rank = s.rank and c.op = 'allreduce'
                  and c.enter_ns >= s.start_ns and c.enter_ns < s.end_ns) as bytes
        from steps s order by s.rank, s.step
    """).fetchall()
    grad = traced.number("gradient bytes")
    for rank, step, optimizers, allreduces, nbytes in per_step:
        assert optimizers == 1, (rank, step)
        assert allreduces >= 1, (rank, step)
        assert nbytes == grad, (rank, step)


def test_every_step_has_compute_and_allreduce(db) -> None:  # type: ignore[no-untyped-def]
    rows = db.execute("""select rank, step, sum(duration_ns) filter (where phase = 'compute'),
                                sum(duration_ns) filter (where phase = 'allreduce')
                         from phases group by rank, step order by rank, step""").fetchall()
    assert len(rows) == 2 * STEPS
    for rank, step, compute, allreduce in rows:
        assert compute > 0 and allreduce > 0, (rank, step, compute, allreduce)


def test_otf2_print_reads_the_run(traced: Run) -> None:
    tool = shutil.which("otf2-print")
    assert tool, "otf2-print not found: the setup installs Debian's otf2-tools (make setup)"
    proc = subprocess.run([tool, str(traced.run_dir / "traces.otf2")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("dltrace.optimizer") == 2 * 2 * STEPS  # enter + leave, 2 ranks


def test_tracing_does_not_change_the_losses(out: Path, traced: Run) -> None:
    plain = instrument_run(out, "--tracer", "none", "-np", "2", "runs/ddp_resnet.py", "--steps", str(STEPS),
                           "--batch-size", "16", name="plain")
    assert plain.proc.returncode == 0, plain.output
    assert plain.losses == traced.losses
    # --tracer none: run.json, no trace
    assert plain.info["tracer"] == "none" and plain.info["trace"] is None
    assert not (plain.run_dir / "traces.otf2").exists() and not (plain.run_dir / "ranks").exists()
    assert "run recorded without a trace" in plain.proc.stdout


def test_accumulation_reduces_only_on_the_last_micro_batch(out: Path) -> None:
    run = instrument_run(out, "-np", "2", "runs/ddp_resnet.py", "--steps", "2", "--accumulate", "4",
                         "--batch-size", "8", name="accum")
    assert run.proc.returncode == 0, run.output
    db = analyze.open(run.run_dir)
    # for each backward, the number of allreduces issued while it ran
    rows = db.execute("""
        select b.rank, b.start_ns,
               (select count(*) from collectives c where c.rank = b.rank and c.op = 'allreduce'
                  and c.enter_ns >= b.start_ns and c.enter_ns <= b.end_ns) as n
        from intervals b join regions r using (region_id)
        where r.name = 'dltrace.backward' order by b.rank, b.start_ns
    """).fetchall()
    assert len(rows) == 2 * 2 * 4
    for i, (_, _, n) in enumerate(rows):
        if i % 4 == 3:
            assert n >= 1, rows
        else:
            assert n == 0, rows
    assert db.execute("select count(*) from steps").fetchone() == (4,)


def test_a_rank_that_raises_is_named_and_the_trace_is_flagged(out: Path) -> None:
    run = instrument_run(out, "-np", "2", "--grace", "5", "runs/ddp_resnet.py", "--steps", "4",
                         "--batch-size", "8", "--fail-at-step", "2", "--fail-rank", "1", name="crash")
    assert run.proc.returncode != 0
    # rank 1 fails first; rank 0 then loses its peer
    assert re.search(r"failed: rank 1 \(RuntimeError: deliberate failure at step 2", run.proc.stderr), run.output
    info = run.info
    assert info["status"] == "failed" and info["complete"] is False and 1 in info["failed_ranks"]
    rank1 = info["rank_info"][1]
    assert rank1["status"] == "exception" and rank1["exit_status"] != 0
    assert "incomplete" in run.proc.stderr
    db = analyze.open(run.run_dir)  # readable
    assert db.execute("select count(*) from steps where rank = 1").fetchone()[0] >= 2
