"""Horovod with PyTorch: 2-rank runs of runs/horovod_resnet.py (our launcher and horovodrun,
with Horovod's timeline imported), an unmodified third-party script, and the rendezvous
environment our launcher gives Horovod."""

from __future__ import annotations

import http.client
import json
import os
import sys
from pathlib import Path

import pytest

import analyze
from analyze import background
from instrument.launch import rank_env
from tests.conftest import RUNS, Run, instrument_run

if os.environ.get("DLTRACE_SKIP_HOROVOD") == "1":  # the setup was told not to build Horovod
    pytest.skip("DLTRACE_SKIP_HOROVOD=1", allow_module_level=True)

STEPS = 3
SCRIPT = "runs/horovod_resnet.py"
THIRD_PARTY = "tests/instrument/hvd_synthetic_benchmark.py"




@pytest.fixture(scope="module")
def parameters() -> dict[str, int]:
    """The example model's parameter names and gradient bytes, as the optimizer names them."""
    sys.path.insert(0, str(RUNS))
    try:
        from workload import make_model
    finally:
        sys.path.remove(str(RUNS))
    model = make_model("compact")
    return {n: p.numel() * p.element_size() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hvd")


@pytest.fixture(scope="module")
def traced(out: Path) -> Run:
    run = instrument_run(out, "-np", "2", SCRIPT, "--steps", str(STEPS), "--batch-size", "16", name="hvd")
    assert run.proc.returncode == 0, run.output
    return run


@pytest.fixture(scope="module")
def db(traced: Run):  # type: ignore[no-untyped-def]
    return analyze.open(traced.run_dir)


def per_step_allreduces(db) -> list[tuple]:  # type: ignore[no-untyped-def]
    """(rank, step, [allreduce region names], bytes, all async, all issued inside backward)."""
    return db.execute("""
        SELECT s.rank, s.step, list(r.name ORDER BY c.seq), sum(c.bytes), bool_and(c.is_async),
               bool_and(EXISTS (SELECT 1 FROM intervals b JOIN regions rb USING (region_id)
                                WHERE b.rank = c.rank AND rb.name = 'dltrace.backward'
                                  AND c.enter_ns BETWEEN b.start_ns AND b.end_ns))
        FROM steps s JOIN collectives c ON c.rank = s.rank AND c.op = 'allreduce'
             AND c.enter_ns >= s.start_ns AND c.enter_ns < s.end_ns
        JOIN regions r ON r.region_id = c.region_id
        GROUP BY s.rank, s.step ORDER BY s.rank, s.step
    """).fetchall()


def assert_compute_and_allreduce_every_step(db, steps: int) -> None:  # type: ignore[no-untyped-def]
    rows = db.execute("""SELECT rank, step, sum(duration_ns) FILTER (WHERE phase = 'compute'),
                                sum(duration_ns) FILTER (WHERE phase = 'allreduce')
                         FROM phases GROUP BY rank, step ORDER BY rank, step""").fetchall()
    assert len(rows) == 2 * steps
    for rank, step, compute, allreduce in rows:
        assert compute > 0 and allreduce > 0, (rank, step, compute, allreduce)


@pytest.mark.slow
def test_summary_names_the_framework(traced: Run) -> None:
    info = traced.info
    assert info["status"] == "ok" and info["complete"] is True
    assert info["framework"] == "horovod-pytorch"
    assert info["versions"]["horovod"] == "0.28.1"
    assert [r["steps"] for r in info["rank_info"]] == [STEPS, STEPS]
    assert "trace written" in traced.proc.stdout


@pytest.mark.slow
def test_each_step_allreduces_every_gradient_once(traced: Run, db, parameters: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    grad = traced.number("gradient bytes")
    assert grad == sum(parameters.values())
    expected = sorted(f"horovod.allreduce:{n}" for n in parameters)
    rows = per_step_allreduces(db)
    assert [(r[0], r[1]) for r in rows] == [(rank, step) for rank in (0, 1) for step in range(STEPS)]
    for rank, step, names, nbytes, is_async, in_backward in rows:
        # the optimizer's own allreduce_async_ calls, one per parameter, from its backward hooks
        assert sorted(names) == expected, (rank, step)
        assert nbytes == grad, (rank, step)
        assert is_async and in_backward, (rank, step)


@pytest.mark.slow
def test_the_optimizer_step_waits_in_synchronize_and_ends_the_step(db) -> None:  # type: ignore[no-untyped-def]
    rows = db.execute("""
        SELECT s.rank, s.step, o.end_ns = s.end_ns,
               (SELECT count(*) FROM intervals w JOIN regions rw USING (region_id)
                WHERE w.rank = s.rank AND rw.name = 'horovod.DistributedOptimizer.synchronize'
                  AND rw.category = 'wait'
                  AND w.start_ns >= o.start_ns AND w.end_ns <= o.end_ns)
        FROM steps s JOIN intervals o ON o.rank = s.rank AND o.start_ns >= s.start_ns AND o.end_ns <= s.end_ns
        JOIN regions ro ON ro.region_id = o.region_id AND ro.name = 'dltrace.optimizer'
        WHERE o.depth = 1 ORDER BY 1, 2
    """).fetchall()
    assert len(rows) == 2 * STEPS
    for rank, step, ends_step, waits in rows:
        assert ends_step and waits >= 1, (rank, step)


@pytest.mark.slow
def test_both_ranks_pair_the_same_tensors(db) -> None:  # type: ignore[no-untyped-def]
    groups = db.execute("""
        SELECT c.comm_id, c.seq, count(*), count(DISTINCT r.name), min(c.ranks_matched), any_value(c.op)
        FROM collectives c JOIN regions r USING (region_id) GROUP BY 1, 2
    """).fetchall()
    assert groups and all(n == 2 and names == 1 and matched == 2 for _, _, n, names, matched, _ in groups)
    bcasts = db.execute("""SELECT rank, count(*), min(root), max(root) FROM collectives
                           WHERE op = 'bcast' GROUP BY rank ORDER BY rank""").fetchall()
    # broadcast_parameters(model.state_dict()): parameters and batch-norm buffers, from rank 0
    assert [b[0] for b in bcasts] == [0, 1] and all(b[1] > 0 and b[2] == b[3] == 0 for b in bcasts)
    names = db.execute("SELECT name FROM communicators").fetchall()
    assert ("horovod",) in names


@pytest.mark.slow
def test_every_step_has_compute_and_allreduce(db) -> None:  # type: ignore[no-untyped-def]
    assert_compute_and_allreduce_every_step(db, STEPS)


@pytest.mark.slow
def test_tracing_does_not_change_the_losses(out: Path, traced: Run) -> None:
    plain = instrument_run(out, "--tracer", "none", "-np", "2", SCRIPT, "--steps", str(STEPS),
                           "--batch-size", "16", name="plain")
    assert plain.proc.returncode == 0, plain.output
    assert plain.losses == traced.losses


@pytest.mark.slow
def test_accumulation_reduces_during_the_last_backward_of_each_step(out: Path, parameters: dict[str, int]) -> None:
    run = instrument_run(out, "-np", "2", SCRIPT, "--steps", "2", "--accumulate", "3", "--batch-size", "8",
                         name="accum")
    assert run.proc.returncode == 0, run.output
    db = analyze.open(run.run_dir)
    counts = [n for (n,) in db.execute("""
        SELECT (SELECT count(*) FROM collectives c WHERE c.rank = b.rank AND c.op = 'allreduce'
                  AND c.enter_ns BETWEEN b.start_ns AND b.end_ns)
        FROM intervals b JOIN regions r USING (region_id)
        WHERE r.name = 'dltrace.backward' ORDER BY b.rank, b.start_ns""").fetchall()]
    assert counts == [0, 0, len(parameters)] * 2 * 2  # 2 ranks x 2 steps x 3 micro-batches
    assert db.execute("SELECT count(*) FROM steps").fetchone() == (4,)


@pytest.mark.slow
def test_horovodrun_with_horovods_timeline_on_the_same_clock(out: Path, traced: Run) -> None:
    run = instrument_run(out, "--launcher", "horovodrun", "--horovod-timeline", "-np", "2", SCRIPT,
                         "--steps", str(STEPS), "--batch-size", "16", name="hvdrun")
    assert run.proc.returncode == 0, run.output
    assert run.info["status"] == "ok" and run.info["launcher"] == "horovodrun"
    assert run.losses == traced.losses  # same arithmetic as with our launcher
    assert (run.run_dir / "horovod-timeline.json").is_file()
    db = analyze.open(run.run_dir)
    assert_compute_and_allreduce_every_step(db, STEPS)
    assert db.execute("SELECT DISTINCT rank FROM locations WHERE kind = 'timeline'").fetchall() == [(0,)]
    inside = db.execute("""
        WITH own AS (SELECT min(i.start_ns) AS lo, max(i.end_ns) AS hi FROM intervals i
                     JOIN locations l USING (location_id) WHERE l.rank = 0 AND l.kind <> 'timeline'),
             imported AS (SELECT i.start_ns, i.end_ns, r.name FROM intervals i
                          JOIN locations l USING (location_id) JOIN regions r USING (region_id)
                          WHERE l.kind = 'timeline')
        SELECT count(*), bool_and(start_ns >= lo AND end_ns <= hi), list(DISTINCT name)
        FROM imported, own""").fetchone()
    assert inside[0] > 0 and inside[1] is True
    assert {"horovod.NEGOTIATE_ALLREDUCE", "horovod.ALLREDUCE", "horovod.GLOO_ALLREDUCE"} <= set(inside[2])
    meta = json.loads((run.run_dir / "ranks" / "rank-00000.json").read_text())["extra"]["horovod_timeline"]
    assert meta["truncated"] is False and meta["check"]["pairs"] > 0
    # Causality: an allreduce starts after rank 0 enqueued it and ends before rank 0 saw it
    # complete; the file's microsecond resolution allows about 2 us either way.
    assert meta["check"]["min_start_margin_ns"] > -10_000
    assert meta["check"]["min_end_margin_ns"] > -10_000
    # negotiation and transfer per step, as `analyze phases` prints them: every step reduces
    # its gradients, so each has both, inside the step
    steps = background.per_step(db)
    assert len(steps) == STEPS
    assert (steps["negotiate_ns"] > 0).all() and (steps["transfer_ns"] > 0).all(), steps
    assert (steps[["negotiate_ns", "fusion_copy_ns", "transfer_ns"]].max(axis=1) <= steps["step_ns"]).all()


@pytest.mark.slow
def test_an_unmodified_third_party_script(out: Path) -> None:
    run = instrument_run(out, "-np", "2", THIRD_PARTY, name="third_party")
    assert run.proc.returncode == 0, run.output
    assert "Img/sec per rank" in run.proc.stdout  # its own timing still works
    steps, n_params, grad = run.number("steps"), run.number("parameters"), run.number("gradient bytes")
    db = analyze.open(run.run_dir)
    # broadcast_optimizer_state's zero-gradient step() is setup, not a training step
    assert db.execute("SELECT count(*) FROM steps GROUP BY rank").fetchall() == [(steps,), (steps,)]
    rows = per_step_allreduces(db)
    assert len(rows) == 2 * steps
    for rank, step, names, nbytes, is_async, in_backward in rows:
        assert len(names) == n_params and nbytes == grad and is_async and in_backward, (rank, step)
    # the closing hvd.allreduce(..., name="img_sec") comes after the last step
    tail = db.execute("""SELECT count(*) FROM collectives c JOIN regions r USING (region_id)
                         WHERE r.name = 'horovod.allreduce:img_sec'
                           AND c.enter_ns > (SELECT max(end_ns) FROM steps s WHERE s.rank = c.rank)""").fetchone()
    assert tail == (2,)


def test_launcher_environment_reaches_horovods_rendezvous_server() -> None:
    provider = rank_env.HorovodGlooEnv()
    provider.start(2)
    try:
        env = provider.env(1, 2)
        assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2"
        assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
        conn = http.client.HTTPConnection(env["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                          int(env["HOROVOD_GLOO_RENDEZVOUS_PORT"]), timeout=5)
        conn.request("PUT", "/global/rank_1", body=b"ok")
        assert conn.getresponse().status == 200
        conn.request("GET", "/global/rank_1")
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        provider.stop()
    assert provider.env(0, 2) == {}  # stopped: nothing for the next job
