"""TensorFlow: TF_CONFIG for the workers, the graph markers around collectives, and 2-rank runs
of runs/tf_sync_resnet.py (model.fit) and runs/tf_ctl_accum.py (gradient accumulation)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import analyze
from instrument.hooks.tensorflow import rendezvous_tf_config
from instrument.launch import rank_env
from tests.conftest import Run, instrument_run
from tests.instrument.test_recorder import Log
from traceio.records import Op

SYNC = "runs/tf_sync_resnet.py"
CTL = "runs/tf_ctl_accum.py"
TINY = ("--model", "tiny", "--batch-size", "8")
SYNC_STEPS = 4
CTL_STEPS, K = 8, 4


# -- TF_CONFIG: our launcher, and the rendezvous for external launchers ------------------------
def test_the_local_launcher_gives_each_rank_its_worker_in_one_cluster() -> None:
    provider = rank_env.TFConfigEnv()
    provider.start(3)
    configs = [json.loads(provider.env(r, 3)["TF_CONFIG"]) for r in range(3)]
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(w.startswith("localhost:") for w in workers)
    for r, config in enumerate(configs):
        assert config == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": r}}


def test_ranks_of_an_external_launcher_build_tf_config_through_the_run_directory(tmp_path: Path) -> None:
    out: dict[int, Any] = {}

    def rank(r: int) -> None:
        env = {"RANK": str(r), "WORLD_SIZE": "2", "DLTRACE_RUN_DIR": str(tmp_path)}
        out[r] = json.loads(rendezvous_tf_config(env) or "null")

    threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out[0]["cluster"] == out[1]["cluster"] and len(set(out[0]["cluster"]["worker"])) == 2
    assert [out[r]["task"] for r in (0, 1)] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    # a single rank needs no cluster
    assert rendezvous_tf_config({"RANK": "0", "WORLD_SIZE": "1", "DLTRACE_RUN_DIR": str(tmp_path)}) is None


# -- the markers, in process ---------------------------------------------------------------------
class Collectives(Log):
    """A recorder keeping each asynchronous collective with its bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.colls: list[tuple[str, int, int, int, int]] = []
        self.lock = threading.Lock()

    def _emit_async(self, rid, begin, end, comm, op, root, sent, recv) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.colls.append((self.name(rid), begin, end, sent, recv))


@pytest.fixture(scope="module")
def tf() -> Any:
    return pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_markers_time_every_execution_without_ordering_collectives(tf: Any) -> None:
    from instrument.hooks.tf_markers import CollectiveTimer

    rec = Collectives()
    rec.now = time.perf_counter_ns  # real times: the check below compares with the host clock
    timer = CollectiveTimer(rec, tf)
    rid = rec.region_id("fake.all_reduce")

    def record(begin: int, end: int, sent: int, recv: int) -> None:
        rec.async_collective(rid, begin, end, 0, Op.ALLREDUCE, -1, sent, recv)

    def collective(x: Any) -> Any:  # stands in for a collective op: same shape out
        return timer.run([x], lambda ts: ts[0] * 2.0, record)

    @tf.function
    def step(a: Any, b: Any) -> Any:
        # each in a cond, as Horovod's DistributedGradientTape issues its allreduces
        ra = tf.cond(tf.reduce_sum(a) > 0, lambda: collective(a), lambda: a)
        rb = tf.cond(tf.reduce_sum(b) > 0, lambda: collective(b), lambda: b)
        return ra + tf.reduce_sum(rb)

    a, b = tf.ones([5]), tf.ones([3, 4])
    for _ in range(3):
        assert step(a, b).numpy().tolist() == [26.0] * 5  # the markers leave the values alone
        timer.drain()  # the hooks drain after each top-level call
    assert sorted((sent, recv) for _, _, _, sent, recv in rec.colls) == [(20, 20)] * 3 + [(48, 48)] * 3
    assert all(0 <= end - begin < 1_000_000_000 for _, begin, end, _, _ in rec.colls)
    assert timer.lost == 0
    # Neither cond waits for the other: the markers' state does not chain the collectives.
    graph = step.get_concrete_function(a, b).graph
    conds = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(conds) == 2 and all(not op.control_inputs for op in conds)

    # In a cond whose predicate is known early (Horovod's is ``size() > 1``), the begin waits
    # for the input's value, not just for the branch to start.
    @tf.function
    def late_input(x: Any, flag: Any) -> Any:
        for _ in range(20):
            x = tf.tanh(tf.matmul(x, x) / 300.0)
        return tf.cond(flag, lambda: collective(x), lambda: x)

    x, flag = tf.random.normal([300, 300], seed=1), tf.constant(True)
    late_input(x, flag)  # traced
    timer.drain()
    for _ in range(3):
        rec.colls.clear()
        t0 = time.perf_counter_ns()
        late_input(x, flag)
        timer.drain()
        (_, begin, end, _, _), = rec.colls
        assert end - begin < (end - t0) / 2, (begin - t0, end - t0)  # the matmuls come first

    # An op run several times within one call keeps its last execution; the others are counted.
    rec.colls.clear()
    looped = tf.function(lambda x: tf.while_loop(lambda i, x: i < 4, lambda i, x: (i + 1, collective(x)),
                                                 (0, x))[1])
    assert looped(tf.ones([3])).numpy().tolist() == [16.0] * 3
    timer.drain()
    assert [(s, r) for _, _, _, s, r in rec.colls] == [(12, 12)] and timer.lost == 3

    rec.colls.clear()
    collective(tf.ones([2, 2]))  # eagerly: timed around the call, recorded at once
    assert [(n, s, r) for n, _, _, s, r in rec.colls] == [("fake.all_reduce", 16, 16)]


# -- 2-rank runs -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tf")


def run_ok(out: Path, name: str, *args: str) -> Run:
    run = instrument_run(out, *args, name=name)
    assert run.proc.returncode == 0, run.output
    return run


@pytest.fixture(scope="module")
def sync(out: Path) -> Run:
    return run_ok(out, "tf-sync", "-np", "2", SYNC, *TINY, "--steps", str(SYNC_STEPS))


@pytest.fixture(scope="module")
def ctl(out: Path) -> Run:
    return run_ok(out, "tf-ctl", "-np", "2", CTL, *TINY, "--steps", str(CTL_STEPS), "--accumulate", str(K))


def allreduces_per_step(db: Any) -> list[tuple[int, int, list[str], int | None, int]]:
    """(rank, step, all-reduce region names, their bytes, how many matched on both ranks)."""
    return db.execute("""
        SELECT s.rank, s.step, coalesce(list(r.name ORDER BY c.enter_ns) FILTER (WHERE r.name IS NOT NULL), []),
               sum(c.bytes), count(*) FILTER (WHERE c.ranks_matched = 2)
        FROM steps s LEFT JOIN collectives c ON c.rank = s.rank AND c.op = 'allreduce'
             AND c.enter_ns >= s.start_ns AND c.enter_ns < s.end_ns
        LEFT JOIN regions r ON r.region_id = c.region_id
        GROUP BY s.rank, s.step ORDER BY s.rank, s.step
    """).fetchall()


def phase_totals(db: Any) -> dict[tuple[int, int], dict[str, int]]:
    rows = db.execute("SELECT rank, step, phase, duration_ns FROM phases").fetchall()
    totals: dict[tuple[int, int], dict[str, int]] = {}
    for rank, step, phase, ns in rows:
        totals.setdefault((rank, step), {})[phase] = ns
    return totals


@pytest.mark.slow
def test_sync_run_has_one_gradient_allreduce_per_step(sync: Run) -> None:
    info = sync.info
    assert info["status"] == "ok" and info["complete"] is True
    assert info["framework"] == "tensorflow-mwms"
    assert [r["steps"] for r in info["rank_info"]] == [SYNC_STEPS, SYNC_STEPS]
    db = analyze.open(sync.run_dir)
    grad = sync.number("gradient bytes")
    rows = allreduces_per_step(db)
    assert [(r[0], r[1]) for r in rows] == [(rank, s) for rank in (0, 1) for s in range(SYNC_STEPS)]
    for rank, step, names, _, matched in rows:
        # model.fit also reduces the loss metric and the step's logs: a few bytes each
        assert names.count("tf.distribute.all_reduce.gradients") == 1, (rank, step, names)
        assert matched == len(names), (rank, step)
    grads = db.execute("""SELECT bytes FROM collectives JOIN regions USING (region_id)
                          WHERE name = 'tf.distribute.all_reduce.gradients'""").fetchall()
    assert grads == [(grad,)] * (2 * SYNC_STEPS)
    for key, phases in phase_totals(db).items():
        assert phases["compute"] > 0 and phases["allreduce"] > 0, (key, phases)
    # MWMS runs a worker's collectives one after another: each begins when it may start (the
    # previous one done), not when its input is ready (the loss metric's, before backward).
    overlaps = db.execute("""
        SELECT rank, enter_ns - lag(leave_ns) OVER (PARTITION BY rank ORDER BY enter_ns) AS gap_ns
        FROM collectives QUALIFY gap_ns < -1000000
    """).fetchall()
    assert overlaps == []


@pytest.mark.slow
def test_accumulation_run_allreduces_once_every_k_steps(ctl: Run) -> None:
    assert ctl.info["framework"] == "tensorflow-mwms"
    db = analyze.open(ctl.run_dir)
    grad = ctl.number("gradient bytes")
    rows = allreduces_per_step(db)
    assert len(rows) == 2 * CTL_STEPS
    totals = phase_totals(db)
    for rank, step, names, nbytes, matched in rows:
        if step % K == K - 1:
            assert names == ["tf.distribute.all_reduce"] and nbytes == grad and matched == 1, (rank, step)
            assert totals[rank, step]["allreduce"] > 0, (rank, step)
        else:
            assert names == [] and totals[rank, step]["allreduce"] == 0, (rank, step, names)
        assert totals[rank, step]["compute"] > 0, (rank, step)
    # each step is one call of the function that ran it
    calls = db.execute("""SELECT r.name, count(*) FROM intervals JOIN regions r USING (region_id)
                          JOIN locations l USING (location_id)
                          WHERE l.is_main AND r.name LIKE 'tf.function:%' GROUP BY 1 ORDER BY 1""").fetchall()
    assert calls == [("tf.function:accumulate_step", 2 * (CTL_STEPS - CTL_STEPS // K)),
                     ("tf.function:sync_step", 2 * (CTL_STEPS // K))]


@pytest.mark.slow
@pytest.mark.parametrize("script", [SYNC, CTL])
def test_tracing_does_not_change_the_losses(out: Path, sync: Run, ctl: Run, script: str) -> None:
    traced, steps = (sync, SYNC_STEPS) if script == SYNC else (ctl, CTL_STEPS)
    extra = ("--accumulate", str(K)) if script == CTL else ()
    plain = run_ok(out, f"plain-{Path(script).stem}", "--tracer", "none", "-np", "2", script, *TINY,
                   "--steps", str(steps), *extra)
    assert len(traced.losses) == steps
    assert plain.losses == traced.losses


@pytest.mark.slow
def test_workers_started_by_torchrun_find_each_other(out: Path) -> None:
    run = run_ok(out, "tf-torchrun", "--launcher", "torchrun", "-np", "2", SYNC, *TINY, "--steps", "2")
    assert sorted(p.name for p in (run.run_dir / "tf-workers").iterdir()) == ["worker-0", "worker-1"]
    assert [r["steps"] for r in run.info["rank_info"]] == [2, 2]


@pytest.mark.slow
def test_the_issue_model_runs_traced(out: Path) -> None:
    """ResNet50 from keras.applications, at the smallest input it takes (slow: ~1 min)."""
    run = run_ok(out, "tf-resnet50", "-np", "2", SYNC, "--model", "resnet50", "--batch-size", "2",
                 "--steps", "2")
    assert run.number("gradient bytes") == 94_220_328  # 23,555,082 float32 parameters with 10 classes
    db = analyze.open(run.run_dir)
    grads = db.execute("""SELECT count(*), min(bytes) FROM collectives JOIN regions USING (region_id)
                          WHERE name = 'tf.distribute.all_reduce.gradients'""").fetchone()
    assert grads == (4, 94_220_328)
